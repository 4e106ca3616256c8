//! The declaration to the builder's calls: an expression of type
//! `dusk::kernels::Result<dusk::kernels::pipeline::Pipeline>` (the builder's own checks,
//! of per-row values and budgets' ranges, run when it is evaluated).

use super::parse::{Budget, PipelineAst, PruneCall, Select};
use proc_macro2::TokenStream;
use quote::{quote, quote_spanned};
use syn::spanned::Spanned;
use syn::Path;

/// The stock policies (`dusk::kernels::policies`): a policy named by one of these bare
/// names is the stock one; any other path is the user's, resolved where the macro is used.
const STOCK_POLICIES: [&str; 4] = ["top_p", "top_k", "ratio_to_max", "top_p_bounded"];

pub fn pipeline(p: &PipelineAst) -> TokenStream {
    let k = quote!(::dusk::kernels);
    let select = select(&p.select);
    let prunes = p.prune.iter().map(prune);
    let attend = match p.attend.kind.to_string().as_str() {
        "dense" => quote!(Dense),
        "head_varlen" => quote!(HeadVarlen),
        _ => quote!(GroupVarlen),
    };
    let mix = p.attend.sparq_mix.is_some();
    let bits = p.bits.iter().map(|b| quote_spanned!(b.span()=> .bits(#b)));
    let dense = p
        .dense_below
        .iter()
        .map(|d| quote_spanned!(d.span()=> .dense_below(#d)));
    quote! {
        #k::pipeline::PipelineBuilder::new()
            .select(#select)
            #(.prune(#prunes))*
            .attend(#k::pipeline::Attend::#attend)
            .sparq_mix(#mix)
            #(#bits)*
            #(#dense)*
            .build()
    }
}

fn budget(b: &Budget) -> TokenStream {
    let k = quote!(::dusk::kernels);
    match b {
        Budget::Fraction(f) => quote!(#k::selectors::Budget::Fraction(#f)),
        Budget::Tokens(t) => quote!(#k::selectors::Budget::Tokens(#t)),
    }
}

fn select(s: &Select) -> TokenStream {
    let k = quote!(::dusk::kernels);
    match s {
        Select::Full => quote!(#k::pipeline::Select::Full),
        Select::Quest { budget: b, sink } => {
            let b = budget(b);
            let sink = sink.as_ref().map_or(quote!(false), |e| quote!(#e));
            quote!(#k::pipeline::Select::Quest { budget: #b, sink: #sink })
        }
        Select::Pages(p) => {
            let b = budget(&p.budget);
            let selector = &p.selector;
            let sink = p.sink.as_ref().map_or(quote!(0), |e| quote!(#e));
            let recent = p.recent.as_ref().map_or(quote!(1), |e| quote!(#e));
            quote!(#k::pipeline::Select::Pages {
                selector: #selector,
                budget: #b,
                keep: #k::selectors::Keep { sink: #sink, recent: #recent },
            })
        }
        Select::Plugin(e) => quote!(#k::pipeline::Select::Plugin(#e)),
    }
}

/// The policy's module: the stock one for a bare stock name, else the path as written.
fn policy_path(p: &Path) -> TokenStream {
    match p.get_ident() {
        Some(id) if STOCK_POLICIES.contains(&id.to_string().as_str()) => {
            quote_spanned!(id.span()=> ::dusk::kernels::policies::#id)
        }
        _ => quote!(#p),
    }
}

/// `Prune::new(&POLICY, Params { .. }.values())`, the struct literal at the user's span, so
/// a missing or unknown parameter is the compiler's error there.
fn prune(c: &PruneCall) -> TokenStream {
    let path = policy_path(&c.policy);
    let span = c.policy.span();
    let fields = c.args.iter().map(|(n, v)| quote!(#n: #v));
    let params = quote_spanned!(span=> #path::Params { #(#fields),* });
    quote!(::dusk::kernels::pipeline::Prune::new(&#path::POLICY, #params.values()))
}
