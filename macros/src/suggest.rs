//! "Did you mean ...?": the known name closest to a misspelt one.

/// The edit distance between `a` and `b`: insertions, deletions, substitutions and swaps of
/// two neighbouring characters each count 1 (the optimal string alignment distance).
pub fn distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let (n, m) = (a.len(), b.len());
    let mut d = vec![vec![0usize; m + 1]; n + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    d[0] = (0..=m).collect();
    for i in 1..=n {
        for j in 1..=m {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[n][m]
}

/// Whether `name` is close enough to `known` to be a misspelling of it: a distance of about
/// one edit per three characters of `name` (`laod` and `arnage` are; `sub` is not `sum`).
/// Names of three characters or fewer only match with two neighbours swapped (`mxa`).
pub fn is_close(name: &str, known: &str) -> bool {
    if name == known {
        return false;
    }
    let len = name.chars().count();
    let d = distance(name, known);
    if len <= 3 {
        return d == 1 && len == known.chars().count() && is_swap(name, known);
    }
    d <= (len - 1) / 3
}

fn is_swap(a: &str, b: &str) -> bool {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let diff: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    matches!(diff[..], [i, j] if j == i + 1 && a[i] == b[j] && a[j] == b[i])
}

/// The known name closest to `name`, if one is close enough to be what was meant.
pub fn closest<'a>(name: &str, known: impl IntoIterator<Item = &'a str>) -> Option<&'a str> {
    known
        .into_iter()
        .filter(|k| is_close(name, k))
        .min_by_key(|k| distance(name, k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn distances() {
        assert_eq!(distance("arange", "arange"), 0);
        assert_eq!(distance("arnage", "arange"), 1);
        assert_eq!(distance("laod", "load"), 1);
        assert_eq!(distance("kount", "count"), 1);
        assert_eq!(distance("cumsun", "cumsum"), 1);
        assert_eq!(distance("", "sum"), 3);
        assert_eq!(distance("atomic_ad", "atomic_add"), 1);
    }

    #[test]
    fn close_names_are_proportionate_to_length() {
        assert!(is_close("arnage", "arange"));
        assert!(is_close("laod", "load"));
        assert!(is_close("stroe", "store"));
        assert!(is_close("kount", "count"));
        assert!(is_close("treshold", "threshold"));
        assert!(is_close("mxa", "max"));
        assert!(is_close("atomicadd", "atomic_add"));
        // Short helper names a kernel may well have are not taken for builtins.
        assert!(!is_close("sub", "sum"));
        assert!(!is_close("sqr", "sqrt"));
        assert!(!is_close("mix", "min"));
        assert!(!is_close("add", "abs"));
        assert!(!is_close("load_block", "load"));
        assert!(!is_close("softplus", "splat"));
        assert!(!is_close("axpy", "abs"));
        assert!(!is_close("min_count", "count"));
        assert!(!is_close("p", "mass"));
        assert!(!is_close("arange", "arange"));
    }

    #[test]
    fn closest_picks_the_nearest() {
        let known = ["exp", "exp2", "log", "log2"];
        assert_eq!(closest("epx2", known), Some("exp2"));
        assert_eq!(closest("logg2", known), Some("log2"));
        assert_eq!(closest("softplus", known), None);
    }
}
