fn main() {
    let _ = dusk::pipeline! {
        select: Full,
        prune: top_k(p = 64),
        attend: group_varlen,
    };
}
