//! The kernel-language guide (`docs/kernel-language.md`) is the source of its examples: it
//! is the documentation of `dusk::guide`, so each of its code blocks is a doc test that
//! builds the kernels, runs them through the interpreter and checks them against plain Rust
//! (`cargo test -p dusk --doc`). The examples keep copies so that they can run on the GPU
//! (`examples/kernel_language/kernels.rs`, `examples/pruning/policy.rs`); these tests fail
//! when a copy is no longer the guide's code, or when a guide block stops being run.

use std::collections::BTreeMap;

const GUIDE: &str = include_str!("../docs/kernel-language.md");

/// The guide's fenced code blocks: the info string and the code, hidden (`# `) lines left
/// out (they are the doc tests' harness, not the example).
fn code_blocks(md: &str) -> Vec<(String, String)> {
    let mut blocks = vec![];
    let mut open: Option<(String, String)> = None;
    for line in md.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(_)) => blocks.push(open.take().unwrap()),
            (Some((_, code)), None) => {
                if line != "#" && !line.starts_with("# ") {
                    code.push_str(line);
                    code.push('\n');
                }
            }
            (None, None) => {}
        }
    }
    assert!(open.is_none(), "an unclosed code block in the guide");
    blocks
}

/// The `#[kernel]` and `#[policy]` functions of `src`, by name: the text from the attribute
/// to the end of the body.
fn items(src: &str) -> BTreeMap<String, String> {
    let lines: Vec<&str> = src.lines().collect();
    let mut out = BTreeMap::new();
    let mut i = 0;
    while i < lines.len() {
        let t = lines[i].trim_start();
        let is_item = ["#[kernel", "#[dusk::kernel", "#[policy", "#[dusk::policy"]
            .iter()
            .any(|a| t.starts_with(a));
        if !is_item {
            i += 1;
            continue;
        }
        let (mut text, mut depth, mut opened, mut name) = (String::new(), 0i32, false, None);
        while i < lines.len() {
            let l = lines[i];
            text.push_str(l);
            text.push('\n');
            if name.is_none() {
                if let Some(at) = l.find("fn ") {
                    let rest = &l[at + 3..];
                    let end = rest.find(['<', '(']).unwrap_or(rest.len());
                    name = Some(rest[..end].trim().to_string());
                }
            }
            if name.is_some() {
                for c in l.chars() {
                    match c {
                        '{' => {
                            depth += 1;
                            opened = true;
                        }
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
            }
            i += 1;
            if opened && depth == 0 {
                break;
            }
        }
        let name = name.expect("an item's `fn` line");
        assert!(
            out.insert(name.clone(), text).is_none(),
            "`{name}` is defined twice"
        );
    }
    out
}

/// The text with formatting left out: whitespace, trailing commas, and `dusk::` in the
/// attribute (`#[kernel]` with `use dusk::kernel;` is `#[dusk::kernel]`).
fn normalized(text: &str) -> String {
    let s: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let s = s.replace("#[dusk::", "#[");
    let mut out = String::new();
    let chars: Vec<char> = s.chars().collect();
    for (i, c) in chars.iter().enumerate() {
        let before_close = matches!(chars.get(i + 1), Some(')' | ']' | '}' | '>'));
        if !(*c == ',' && before_close) {
            out.push(*c);
        }
    }
    out
}

fn guide_items() -> BTreeMap<String, String> {
    let mut all = BTreeMap::new();
    for (info, code) in code_blocks(GUIDE) {
        if info.starts_with("rust") {
            for (name, text) in items(&code) {
                assert!(
                    all.insert(name.clone(), text).is_none(),
                    "the guide defines `{name}` twice"
                );
            }
        }
    }
    all
}

/// Every function of `example` must be the guide's function of that name.
fn check_copies(path: &str, example: &str, want: &[&str]) {
    let guide = guide_items();
    let copies = items(example);
    let names: Vec<&str> = copies.keys().map(|s| s.as_str()).collect();
    assert_eq!(names, want, "the kernels of {path}");
    for (name, text) in &copies {
        let Some(original) = guide.get(name) else {
            panic!("{path} has `{name}`, which docs/kernel-language.md does not");
        };
        assert!(
            normalized(text) == normalized(original),
            "`{name}` in {path} differs from docs/kernel-language.md; make it the guide's \
             code again (the guide's is the one its doc tests check).\n\
             --- the guide:\n{original}--- {path}:\n{text}"
        );
    }
}

#[test]
fn the_kernel_language_example_runs_the_guides_kernels() {
    check_copies(
        "examples/kernel_language/kernels.rs",
        include_str!("../examples/kernel_language/kernels.rs"),
        &["gemv", "keep_positive", "octaves", "softmax", "vector_add"],
    );
}

#[test]
fn the_pruning_example_runs_the_guides_policy() {
    check_copies(
        "examples/pruning/policy.rs",
        include_str!("../examples/pruning/policy.rs"),
        &["top_p_quarter"],
    );
}

/// Every Rust block of the guide is a doc test that runs: none is `ignore`, `no_run` or
/// `compile_fail`, and the guide is the doc of `dusk::guide` (so `cargo test` runs them).
#[test]
fn every_rust_block_of_the_guide_is_run() {
    let blocks = code_blocks(GUIDE);
    let rust: Vec<&String> = blocks
        .iter()
        .map(|(info, _)| info)
        .filter(|i| i.starts_with("rust"))
        .collect();
    assert!(rust.len() >= 10, "{} Rust blocks", rust.len());
    for info in rust {
        assert_eq!(info, "rust", "a guide block that does not run: ```{info}");
    }
    for (info, _) in &blocks {
        assert!(
            ["rust", "text", "sh"].contains(&info.as_str()),
            "a code block of an unknown kind: ```{info}"
        );
    }
    let lib = include_str!("../src/lib.rs");
    assert!(
        lib.contains("#[doc = include_str!(\"../docs/kernel-language.md\")]"),
        "src/lib.rs no longer includes the guide as a doc module"
    );
}

#[test]
fn the_checker_sees_differences() {
    let guide = guide_items();
    let softmax = &guide["softmax"];
    assert_eq!(
        normalized(softmax),
        normalized(&softmax.replace("#[dusk::kernel]", "#[kernel]"))
    );
    assert_ne!(
        normalized(softmax),
        normalized(&softmax.replace("max(v, 1)", "max(v, 0)"))
    );
    assert_eq!(
        normalized("f(a,\n    b,\n)"),
        normalized("f(a, b)"),
        "trailing commas are formatting"
    );
}
