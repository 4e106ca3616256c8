fn main() {
    let _ = dusk::pipeline! {
        select: Quest(budget = 0.25),
        prune: top_p(),
        attend: group_varlen,
    };
}
