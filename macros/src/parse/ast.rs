//! The kernel language's own syntax tree: what `parse` makes from syn's and `generate`
//! turns into builder calls. Every node keeps the span of the source it came from, so the
//! generated calls (and the builder's `#[track_caller]` locations) point at the user's code.

use proc_macro2::Span;
use syn::{Attribute, Ident, LitFloat, LitInt, Path, Type, Visibility};

/// A `#[kernel]` function: its signature and its body.
pub struct Kernel {
    pub sig: Signature,
    pub body: Block,
}

/// Everything about a kernel but its body: enough to generate `build` and `launch`.
pub struct Signature {
    /// Outer attributes of the function (doc comments, `#[allow]`), moved to the module.
    pub attrs: Vec<Attribute>,
    pub vis: Visibility,
    pub name: Ident,
    /// Type parameters (`<T>`: an element type each), before the const generics.
    pub type_params: Vec<Ident>,
    pub consts: Vec<ConstParam>,
    pub params: Vec<Param>,
    pub options: Options,
    /// Whether the function declares a return type: it is a helper whose tail expression is
    /// its value (`-> Tensor`), or whose tail is a tuple of its values (`-> (i32, i64)`).
    pub returns: Option<Returns>,
}

/// A helper's declared return type.
#[derive(Clone, Copy)]
pub struct Returns {
    pub span: Span,
    /// How many values it returns: 1, or the length of a tuple type.
    pub count: usize,
}

/// The attribute's arguments: `#[kernel(num_warps = 8, min_programs_per_sm = 2, debug)]`
/// (the numbers may be constant generics of the kernel),
/// and `crate = "path"` where dusk's crates are reached through another path than `::dusk`
/// (a module re-exporting `compiler`, `runtime` and `half`, as inside dusk itself).
#[derive(Default)]
pub struct Options {
    /// A literal or a constant generic of the kernel (`num_warps = WARPS`).
    pub num_warps: Option<LitOrConst>,
    pub min_programs_per_sm: Option<LitOrConst>,
    pub debug: bool,
    pub krate: Option<syn::Path>,
}

/// An option's value: an integer literal, or the name of one of the kernel's constant
/// generics, so that one definition serves every launch configuration.
pub enum LitOrConst {
    Lit(LitInt),
    Const(Ident),
}

impl syn::parse::Parse for LitOrConst {
    fn parse(input: syn::parse::ParseStream) -> syn::Result<Self> {
        if input.peek(LitInt) {
            Ok(LitOrConst::Lit(input.parse()?))
        } else {
            Ok(LitOrConst::Const(input.parse()?))
        }
    }
}

/// `const N: usize` (any integer type) or `const FLAG: bool`.
pub struct ConstParam {
    pub name: Ident,
    pub ty: Type,
    pub is_bool: bool,
}

/// A kernel parameter: `x: Ptr<f32>` or `n: i32`.
pub struct Param {
    pub name: Ident,
    pub mutable: bool,
    pub ty: ParamTy,
    /// The span of the parameter's type.
    pub ty_span: Span,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum ParamTy {
    Ptr(ElemTy),
    Scalar(ElemTy),
    /// `Block<T>` or `Block<Ptr<T>>` (`ptr`): a block of any shape, a parameter of helpers
    /// only (a kernel launched from the host takes pointers and scalars).
    Block {
        elem: ElemTy,
        ptr: bool,
    },
}

/// The element types of the IR, as they are spelled in kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ElemTy {
    F16,
    BF16,
    F32,
    I32,
    I64,
    U8,
    Bool,
    /// A type parameter of the kernel (`fn k<T>(x: Ptr<T>)`), by name: any element type
    /// but `bool`, chosen when the kernel is built (`build::<f16>()`).
    Param(&'static str),
}

impl ElemTy {
    /// The element type a name spells: a concrete one, or a type parameter of the kernel
    /// being parsed ([`TypeParams`]).
    pub fn from_name(s: &str) -> Option<ElemTy> {
        Some(match s {
            "f16" => ElemTy::F16,
            "bf16" => ElemTy::BF16,
            "f32" => ElemTy::F32,
            "i32" => ElemTy::I32,
            "i64" => ElemTy::I64,
            "u8" => ElemTy::U8,
            "bool" => ElemTy::Bool,
            _ => return TypeParams::find(s).map(ElemTy::Param),
        })
    }

    /// How a kernel spells it: `f16`, `T`.
    pub fn spelled(self) -> String {
        match self {
            ElemTy::Param(n) => n.to_string(),
            e => format!("{e:?}").to_lowercase(),
        }
    }
}

/// The type parameters of the kernel being parsed, so that its signature and body read `T`
/// as an element type. Set for the parse of one `#[kernel]` (a macro expansion parses one
/// function at a time) and cleared after it.
pub struct TypeParams;

thread_local! {
    static TYPE_PARAMS: std::cell::RefCell<Vec<&'static str>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl TypeParams {
    /// Runs `f` with `names` as the type parameters in scope. The names are leaked: a
    /// macro expansion is a short-lived process and each name is a few bytes.
    pub fn scoped<R>(names: &[String], f: impl FnOnce() -> R) -> R {
        let leaked: Vec<&'static str> = names
            .iter()
            .map(|n| &*Box::leak(n.clone().into_boxed_str()))
            .collect();
        TYPE_PARAMS.with(|t| *t.borrow_mut() = leaked);
        let r = f();
        TYPE_PARAMS.with(|t| t.borrow_mut().clear());
        r
    }

    fn find(name: &str) -> Option<&'static str> {
        TYPE_PARAMS.with(|t| t.borrow().iter().copied().find(|n| *n == name))
    }
}

/// `{ stmts; tail }`.
pub struct Block {
    pub stmts: Vec<Stmt>,
    pub tail: Option<Box<Expr>>,
}

pub enum Stmt {
    /// `let x = e;`, `let mut x = e;`; `name` is `None` for `let _ = e;`.
    Let {
        name: Option<Ident>,
        mutable: bool,
        init: Expr,
        span: Span,
    },
    /// `let (a, mut b, _) = helper(..);`: the values of a helper returning a tuple (or of a
    /// tuple `(x, y, z)`), each name with whether it is `mut` (`None` for `_`).
    LetTuple {
        names: Vec<(Option<Ident>, bool)>,
        init: Expr,
        span: Span,
    },
    /// `x = e;` or `x op= e;` (`op` with the operator's span).
    Assign {
        target: Ident,
        op: Option<(BinOp, Span)>,
        value: Expr,
        span: Span,
    },
    For(Box<For>),
    /// An expression evaluated for its effect (`store(..)`, a helper call, an `if`).
    Expr(Expr),
}

impl Stmt {
    /// The names a `let` declares.
    pub fn declared(&self) -> Vec<&Ident> {
        match self {
            Stmt::Let { name, .. } => name.iter().collect(),
            Stmt::LetTuple { names, .. } => names.iter().filter_map(|(n, _)| n.as_ref()).collect(),
            _ => vec![],
        }
    }
}

/// `for var in (lo..hi).step_by(step) { body }`; `#[bound(n)] while cond { body }` is parsed
/// as `for _ in 0..n { if cond { body } }`.
pub struct For {
    /// `None` for `_`.
    pub var: Option<Ident>,
    pub lo: Expr,
    pub hi: Expr,
    pub step: Option<Expr>,
    pub body: Block,
    /// `#[unroll]`: the loop runs when the kernel is built (the bounds are compile-time
    /// integers, the variable is one), repeating its body in the IR.
    pub unroll: bool,
    /// The `for` (or `while`) keyword.
    pub span: Span,
}

/// `if cond { then } else { otherwise }`; `else if` is an `otherwise` block holding one `if`.
pub struct If {
    pub cond: Box<Expr>,
    pub then: Block,
    pub otherwise: Option<Block>,
    /// The `if` keyword.
    pub span: Span,
}

pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}

pub enum ExprKind {
    /// A local, a parameter or a const generic.
    Var(Ident),
    /// An integer literal; with a suffix (`4u8`) it is a constant of that type.
    Int(LitInt, Option<ElemTy>),
    Float(LitFloat, Option<ElemTy>),
    Bool(bool),
    /// `f32::INFINITY`, `i32::MAX`, ...: a compile-time number (`is_float` tells which).
    PrimConst {
        path: Path,
        is_float: bool,
    },
    Binary {
        op: BinOp,
        lhs: Box<Expr>,
        rhs: Box<Expr>,
    },
    Unary {
        op: UnOp,
        expr: Box<Expr>,
    },
    /// `e as T`, `e.to::<T>()`.
    Cast {
        expr: Box<Expr>,
        to: ElemTy,
    },
    /// A builtin, called as a function or (sugar) as a method with the receiver first.
    Builtin {
        func: Builtin,
        /// The turbofish type: `ptr_cast::<i32>`, `zeros::<f32>`.
        ty: Option<ElemTy>,
        args: Vec<Expr>,
    },
    /// `[d0, d1]`: only an argument of `splat` and `zeros`.
    Shape(Vec<Expr>),
    /// A call of another `#[kernel]` function: `helper(x)` -> `helper::inline(b, x)`.
    Helper {
        path: Path,
        generics: Option<syn::AngleBracketedGenericArguments>,
        args: Vec<Expr>,
    },
    If(If),
    Block(Block),
    /// `(a, b)`: only the tail of a helper that returns a tuple.
    Tuple(Vec<Expr>),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    BitAnd,
    BitOr,
    BitXor,
    Shl,
    Shr,
    Lt,
    Le,
    Gt,
    Ge,
    Eq,
    Ne,
    /// `&&`
    And,
    /// `||`
    Or,
}

impl BinOp {
    pub fn is_cmp(self) -> bool {
        matches!(
            self,
            BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge | BinOp::Eq | BinOp::Ne
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

/// The builtin functions of the language.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Builtin {
    ProgramId,
    NumPrograms,
    Arange,
    Load,
    Store,
    Where,
    Exp2,
    Log2,
    Exp,
    Log,
    Sqrt,
    Rsqrt,
    Abs,
    Minimum,
    Maximum,
    Sum,
    Max,
    Min,
    Expand,
    Splat,
    Zeros,
    PtrCast,
    Dp2a,
    DotInt4,
    Dot,
    DotTa,
    Shared,
    AtomicAdd,
    Cumsum,
    Bitcast,
    Barrier,
    PrefetchL2,
    Arrive,
    Signal,
    AwaitCount,
    LoadFresh,
    GlobalTimer,
    SmId,
    Sleep,
}
