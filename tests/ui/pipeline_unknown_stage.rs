fn main() {
    let _ = dusk::pipeline! {
        select: Quest(budget = 0.25),
        prune: top_p(p = 0.95),
        attnd: group_varlen,
    };
}
