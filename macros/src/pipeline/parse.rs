//! The declaration's syntax: `stage: value` entries separated by commas.
//!
//! ```text
//! select: Full | Quest(budget = 0.25 | 4096, sink = true)
//!       | Pages(selector = PATH, budget = .., sink = N, recent = N) | Plugin(EXPR)
//! prune:  POLICY(param = EXPR, ..)  or  [POLICY(..), POLICY(..)]   (repeatable, optional)
//! attend: dense | head_varlen | group_varlen, optionally (sparq_mix)
//! bits: 4 | 8        dense_below: N                                  (optional)
//! ```

use crate::suggest;
use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream, Parser};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{bracketed, parenthesized, Error, Expr, Ident, Lit, Path, Token};

/// The stages and options an entry may name.
const KEYS: [&str; 5] = ["select", "prune", "attend", "bits", "dense_below"];
/// The attentions.
const ATTENDS: [&str; 3] = ["dense", "head_varlen", "group_varlen"];
/// The selectors `select:` takes.
const SELECTORS: [&str; 4] = ["Full", "Quest", "Pages", "Plugin"];
/// Selectors that plug into the select slot as `Plugin(..)` values (`DsSelect`,
/// `SparqSelect` of `dusk::kernels::pipeline`): they take a calibration or options the
/// declaration does not spell.
const PLUGINS: [&str; 4] = ["SparQ", "Sparq", "DoubleSparsity", "DS"];

pub struct PipelineAst {
    pub select: Select,
    pub prune: Vec<PruneCall>,
    pub attend: Attend,
    pub bits: Option<Expr>,
    pub dense_below: Option<Expr>,
}

pub enum Budget {
    Fraction(Lit),
    Tokens(Lit),
}

pub enum Select {
    Full,
    Quest { budget: Budget, sink: Option<Expr> },
    Pages(Box<Pages>),
    Plugin(Expr),
}

/// `Pages(selector = .., budget = .., sink = .., recent = ..)`.
pub struct Pages {
    pub selector: Expr,
    pub budget: Budget,
    pub sink: Option<Expr>,
    pub recent: Option<Expr>,
}

/// `POLICY(name = value, ..)`.
pub struct PruneCall {
    pub policy: Path,
    pub args: Vec<(Ident, Expr)>,
}

pub struct Attend {
    pub kind: Ident,
    /// `(sparq_mix)`, when given.
    pub sparq_mix: Option<Ident>,
}

/// `name = value`.
struct Arg {
    name: Ident,
    value: Expr,
}

impl Parse for Arg {
    fn parse(input: ParseStream) -> syn::Result<Arg> {
        let name: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        Ok(Arg {
            name,
            value: input.parse()?,
        })
    }
}

/// `( args )`, or nothing.
fn args(input: ParseStream) -> syn::Result<Vec<Arg>> {
    if !input.peek(syn::token::Paren) {
        return Ok(vec![]);
    }
    let content;
    parenthesized!(content in input);
    let list = Punctuated::<Arg, Token![,]>::parse_terminated(&content)?;
    Ok(list.into_iter().collect())
}

pub fn pipeline(input: TokenStream) -> syn::Result<PipelineAst> {
    Parser::parse2(parse_entries, input)
}

fn parse_entries(input: ParseStream) -> syn::Result<PipelineAst> {
    let (mut select, mut attend, mut bits, mut dense_below) = (None, None, None, None);
    let mut prune = vec![];
    while !input.is_empty() {
        let key: Ident = input.parse()?;
        input.parse::<Token![:]>()?;
        let name = key.to_string();
        let once = |seen: bool| {
            if seen {
                Err(Error::new(key.span(), format!("`{name}` is given twice")))
            } else {
                Ok(())
            }
        };
        match name.as_str() {
            "select" => {
                once(select.is_some())?;
                select = Some(parse_select(input)?);
            }
            "prune" => {
                if input.peek(syn::token::Bracket) {
                    let content;
                    bracketed!(content in input);
                    let calls = Punctuated::<PruneCall, Token![,]>::parse_terminated(&content)?;
                    prune.extend(calls);
                } else {
                    prune.push(input.parse()?);
                }
            }
            "attend" => {
                once(attend.is_some())?;
                attend = Some(parse_attend(input)?);
            }
            "bits" => {
                once(bits.is_some())?;
                bits = Some(input.parse()?);
            }
            "dense_below" => {
                once(dense_below.is_some())?;
                dense_below = Some(input.parse()?);
            }
            _ => {
                let hint = suggest::closest(&name, KEYS)
                    .map(|k| format!("did you mean `{k}`? "))
                    .unwrap_or_default();
                return Err(Error::new(
                    key.span(),
                    format!(
                        "unknown pipeline stage `{name}`; {hint}the stages are `select`, \
                         `prune` and `attend` (options: `bits`, `dense_below`)"
                    ),
                ));
            }
        }
        if !input.is_empty() {
            input.parse::<Token![,]>()?;
        }
    }
    let select = select.ok_or_else(|| {
        Error::new(
            Span::call_site(),
            "a pipeline needs `select: ..` (Full, Quest(..), Pages(..) or Plugin(..))",
        )
    })?;
    let attend: Attend = attend.ok_or_else(|| {
        Error::new(
            Span::call_site(),
            "a pipeline needs `attend: ..` (dense, head_varlen or group_varlen)",
        )
    })?;
    check_composition(&select, &prune, &attend)?;
    Ok(PipelineAst {
        select,
        prune,
        attend,
        bits,
        dense_below,
    })
}

/// The compositions that cannot work whatever the shapes: dense attention after a stage
/// that narrows the tokens, SparQ's output mix without a selector that makes it or with a
/// pruner after it.
fn check_composition(select: &Select, prune: &[PruneCall], attend: &Attend) -> syn::Result<()> {
    let full = matches!(select, Select::Full);
    if attend.kind == "dense" && (!full || !prune.is_empty()) {
        return Err(Error::new(
            attend.kind.span(),
            "dense attention would ignore the tokens the selector or a pruner keeps: \
             attend with `group_varlen` (or `head_varlen` for MHA)",
        ));
    }
    match (&attend.sparq_mix, select) {
        (Some(mix), Select::Full | Select::Quest { .. } | Select::Pages(_)) => Err(Error::new(
            mix.span(),
            "SparQ's output mix (`sparq_mix`) needs SparQ's selector, which makes its `alpha` \
             and the mean of V: select it as `Plugin(SparqSelect { .. })`",
        )),
        (Some(mix), _) if !prune.is_empty() => Err(Error::new(
            mix.span(),
            "SparQ's output mix (`sparq_mix`) weighs SparQ's own selection by its `alpha`: a \
             pruner after it would attend to fewer tokens than alpha weighs; drop the `prune` \
             stages or the mix",
        )),
        _ => Ok(()),
    }
}

fn parse_select(input: ParseStream) -> syn::Result<Select> {
    let kind: Ident = input.parse()?;
    let name = kind.to_string();
    if name == "Plugin" {
        let content;
        parenthesized!(content in input);
        return Ok(Select::Plugin(content.parse()?));
    }
    let args = args(input)?;
    let get = |key: &str| -> Option<Expr> {
        let i = args.iter().position(|a| a.name == key)?;
        Some(args[i].value.clone())
    };
    let allowed: &[&str] = match name.as_str() {
        "Full" => &[],
        "Quest" => &["budget", "sink"],
        "Pages" => &["selector", "budget", "sink", "recent"],
        _ if PLUGINS.contains(&name.as_str()) => {
            return Err(Error::new(
                kind.span(),
                format!(
                    "`{name}` plugs into the select slot as a value: `select: \
                     Plugin(DsSelect {{ .. }})` or `Plugin(SparqSelect {{ .. }})` \
                     (dusk::kernels::pipeline)"
                ),
            ))
        }
        _ => {
            let hint = suggest::closest(&name, SELECTORS)
                .map(|k| format!("did you mean `{k}`? "))
                .unwrap_or_default();
            return Err(Error::new(
                kind.span(),
                format!(
                    "unknown selector `{name}`; {hint}the selectors are `Full`, `Quest(..)`, \
                     `Pages(..)` and `Plugin(..)`"
                ),
            ));
        }
    };
    if let Some(a) = args
        .iter()
        .find(|a| !allowed.contains(&a.name.to_string().as_str()))
    {
        return Err(Error::new(
            a.name.span(),
            format!(
                "`{name}` takes {}",
                if allowed.is_empty() {
                    "no options".to_string()
                } else {
                    allowed
                        .iter()
                        .map(|k| format!("`{k}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ),
        ));
    }
    let budget = |e: Option<Expr>| -> syn::Result<Budget> {
        let e = e.ok_or_else(|| {
            Error::new(
                kind.span(),
                format!("`{name}` needs `budget = ..`: a fraction in (0, 1] or a count of tokens"),
            )
        })?;
        parse_budget(e)
    };
    Ok(match name.as_str() {
        "Full" => Select::Full,
        "Quest" => Select::Quest {
            budget: budget(get("budget"))?,
            sink: get("sink"),
        },
        _ => Select::Pages(Box::new(Pages {
            selector: get("selector").ok_or_else(|| {
                Error::new(kind.span(), "`Pages` needs `selector = ..` (a `Selector`)")
            })?,
            budget: budget(get("budget"))?,
            sink: get("sink"),
            recent: get("recent"),
        })),
    })
}

/// A float literal in (0, 1] is a fraction of each sequence, an integer one a count of
/// tokens (at least 1).
fn parse_budget(e: Expr) -> syn::Result<Budget> {
    let span = e.span();
    let Expr::Lit(lit) = e else {
        return Err(Error::new(
            span,
            "a budget is a literal: a fraction in (0, 1] (0.25) or a count of tokens (4096)",
        ));
    };
    match &lit.lit {
        Lit::Float(f) => {
            let v: f64 = f.base10_parse()?;
            if !(v > 0.0 && v <= 1.0) {
                return Err(Error::new(span, "a fractional budget lies in (0, 1]"));
            }
            Ok(Budget::Fraction(lit.lit))
        }
        Lit::Int(i) => {
            let v: u64 = i.base10_parse()?;
            if v == 0 {
                return Err(Error::new(span, "a budget of tokens is at least 1"));
            }
            Ok(Budget::Tokens(lit.lit))
        }
        _ => Err(Error::new(
            span,
            "a budget is a fraction in (0, 1] (0.25) or a count of tokens (4096)",
        )),
    }
}

impl Parse for PruneCall {
    fn parse(input: ParseStream) -> syn::Result<PruneCall> {
        let policy: Path = input.parse()?;
        let args = args(input)?;
        Ok(PruneCall {
            policy,
            args: args.into_iter().map(|a| (a.name, a.value)).collect(),
        })
    }
}

fn parse_attend(input: ParseStream) -> syn::Result<Attend> {
    let kind: Ident = input.parse()?;
    let name = kind.to_string();
    if !ATTENDS.contains(&name.as_str()) {
        let hint = suggest::closest(&name, ATTENDS)
            .map(|k| format!("did you mean `{k}`? "))
            .unwrap_or_default();
        return Err(Error::new(
            kind.span(),
            format!(
                "unknown attention `{name}`; {hint}the attentions are `dense`, `head_varlen` \
                 and `group_varlen`"
            ),
        ));
    }
    let mut sparq_mix = None;
    if input.peek(syn::token::Paren) {
        let content;
        parenthesized!(content in input);
        let opt: Ident = content.parse()?;
        if opt != "sparq_mix" {
            return Err(Error::new(
                opt.span(),
                "the attention's one option is `sparq_mix` (SparQ's output mix)",
            ));
        }
        sparq_mix = Some(opt);
    }
    Ok(Attend { kind, sparq_mix })
}
