//! A readable text form of the IR, one op a line, nested regions indented.

use crate::ir::*;
use std::fmt::Write;

/// The kernel as text, e.g. `%7 = add %5, %6 : i32[128]`.
pub fn print_kernel(k: &Kernel) -> String {
    let mut s = String::new();
    let params: Vec<String> = k
        .params
        .iter()
        .map(|p| format!("%{}: {} /*{}*/", p.value.0, p.ty.ir_name(), p.name))
        .collect();
    let occupancy = if k.min_programs_per_sm > 0 {
        format!(" min_programs_per_sm={}", k.min_programs_per_sm)
    } else {
        String::new()
    };
    let occupancy = if k.vector_bytes != 16 {
        format!("{occupancy} vector_bytes={}", k.vector_bytes)
    } else {
        occupancy
    };
    let _ = writeln!(
        s,
        "kernel @{}({}) num_warps={}{occupancy} {{",
        k.name,
        params.join(", "),
        k.num_warps
    );
    print_region(k, &k.body, 1, &mut s);
    s.push_str("}\n");
    s
}

fn vals(v: &[ValueId]) -> String {
    v.iter()
        .map(|v| format!("%{}", v.0))
        .collect::<Vec<_>>()
        .join(", ")
}

fn attrs(kind: &OpKind) -> String {
    use OpKind::*;
    match kind {
        ProgramId { axis } | NumPrograms { axis } => format!(" axis={axis}"),
        Constant { value, .. } => match value {
            Const::Bool(b) => format!(" {b}"),
            Const::Int(i) => format!(" {i}"),
            Const::Float(f) => format!(" {f:?}"),
        },
        Arange { start, end } => format!(" {start}..{end}"),
        Splat { shape, .. } => format!(" shape={shape:?}"),
        Expand { axis, size, .. } => format!(" axis={axis} size={size}"),
        Reduce { axis, .. } => format!(" axis={axis}"),
        MultiReduce { ops, .. } => {
            let names: Vec<&str> = ops
                .iter()
                .map(|o| match o {
                    ReduceOp::Sum => "sum",
                    ReduceOp::Max => "max",
                    ReduceOp::Min => "min",
                })
                .collect();
            format!(" [{}]", names.join(", "))
        }
        Cast { to, .. } | Bitcast { to, .. } | PtrCast { to, .. } => format!(" to {}", to.name()),
        SharedAlloc { dtype, len } => format!(" {len} x {}", dtype.name()),
        AsyncCopy { mask: Some(_), .. } => " masked".to_string(),
        AsyncWait { pending } => format!(" pending={pending}"),
        LoadTile {
            rows,
            cols,
            row_stride,
            ..
        } => format!(" {rows}x{cols} stride={row_stride}"),
        Prefetch {
            mask, bytes, level, ..
        } => {
            format!(
                "{} {bytes} bytes into {}",
                if mask.is_some() { " masked" } else { "" },
                level.ptx()
            )
        }
        Load {
            mask,
            other,
            streaming,
            ..
        } => {
            let mut a = String::new();
            if *streaming {
                a.push_str(" streaming");
            }
            if mask.is_some() {
                a.push_str(" masked");
            }
            if other.is_some() {
                a.push_str(" with_other");
            }
            a
        }
        _ => String::new(),
    }
}

fn print_region(k: &Kernel, r: &Region, depth: usize, s: &mut String) {
    let pad = "  ".repeat(depth);
    for op in &r.ops {
        let _ = write!(s, "{pad}");
        if !op.results.is_empty() {
            let _ = write!(s, "{} = ", vals(&op.results));
        }
        let _ = write!(s, "{}{}", op.kind.name(), attrs(&op.kind));
        let operands = op.kind.operands();
        if !operands.is_empty() {
            let _ = write!(s, " {}", vals(&operands));
        }
        if !op.results.is_empty() {
            let tys: Vec<String> = op.results.iter().map(|v| k.ty(*v).ir_name()).collect();
            let _ = write!(s, " : {}", tys.join(", "));
        }
        let regions = op.kind.regions();
        if regions.is_empty() {
            s.push('\n');
            continue;
        }
        for (i, sub) in regions.iter().enumerate() {
            let args = if sub.args.is_empty() {
                String::new()
            } else {
                format!("({}) ", vals(&sub.args))
            };
            let head = if i == 0 { " " } else { " else " };
            let _ = writeln!(s, "{head}{args}{{");
            print_region(k, sub, depth + 1, s);
            let _ = write!(s, "{pad}}}");
        }
        s.push('\n');
    }
}
