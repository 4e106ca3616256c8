fn main() {
    let _ = dusk::pipeline! {
        select: Plugin(sparq()),
        prune: top_p(p = 0.95),
        attend: group_varlen(sparq_mix),
    };
}
