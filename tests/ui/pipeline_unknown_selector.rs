fn main() {
    let _ = dusk::pipeline! {
        select: Qest(budget = 0.25),
        attend: group_varlen,
    };
}
