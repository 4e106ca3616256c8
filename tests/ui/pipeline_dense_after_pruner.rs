fn main() {
    let _ = dusk::pipeline! {
        select: Full,
        prune: top_p(p = 0.95),
        attend: dense,
    };
}
