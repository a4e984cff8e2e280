//! The layout's rules, checked on the source itself:
//!
//! - every top-level module imports only modules of lower layers
//!   ([`LAYERS`]), so there is no cycle between folders;
//! - no file module imports one that imports it back, directly or through
//!   others (a folder's `mod.rs` re-exporting its children is not an import);
//! - no function in `src/` is longer than [`MAX_FN_LINES`] lines.
//!
//! It reads `src/` as text: `crate::a::b`, `super::x` and, in a folder's
//! `mod.rs`, `child::x` paths outside comments are the imports.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Lowest first. A module may import only modules listed before it.
/// `clock` and `amqp` are leaves: small helpers every layer may use.
const LAYERS: &[&str] = &[
    "clock",
    "amqp",
    "policy",
    "message",
    "history",
    "telemetry",
    "config",
    "topology",
    "publish",
    "events",
    "delay",
    "deliver",
    "isolation",
    "control",
    "worker",
    "ops",
    "console",
    "bench",
    "cli",
];

const MAX_FN_LINES: usize = 60;

struct Module {
    /// e.g. `["delay", "hold"]`; the crate root is `[]`.
    path: Vec<String>,
    /// Source with comments and string literals blanked.
    code: String,
    raw: String,
    file: PathBuf,
    is_mod_rs: bool,
    /// A `#[path]` file of unit tests, part of its parent's module: not a
    /// module of its own in the import graph, but its functions count.
    is_test_file: bool,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rs_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let p = entry.expect("dir entry").path();
        if p.is_dir() {
            rs_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// Blanks `//` comments, `/* */` comments and string literals, keeping
/// line breaks, so paths in docs or log targets are not taken for imports.
fn strip(s: &str) -> String {
    let b = s.as_bytes();
    let (mut out, mut i) = (String::with_capacity(s.len()), 0);
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let end = s[i + 2..].find("*/").map_or(b.len(), |e| i + 4 + e);
            out.extend(s[i..end].chars().map(|c| if c == '\n' { c } else { ' ' }));
            i = end;
        } else if b[i] == b'"' && !(i > 0 && b[i - 1] == b'\'') {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                if i < b.len() && b[i] == b'\n' {
                    out.push('\n');
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else {
            let c = s[i..].chars().next().expect("char");
            out.push(c);
            i += c.len_utf8();
        }
    }
    out
}

fn modules() -> Vec<Module> {
    let root = src();
    let mut files = Vec::new();
    rs_files(&root, &mut files);
    let mut mods = Vec::new();
    for file in files {
        let rel = file.strip_prefix(&root).expect("under src");
        let mut path: Vec<String> = rel
            .iter()
            .map(|c| c.to_string_lossy().trim_end_matches(".rs").to_string())
            .collect();
        let name = path.pop().expect("file name");
        let is_mod_rs = name == "mod";
        if rel == Path::new("main.rs") || rel == Path::new("lib.rs") {
            continue;
        }
        if !is_mod_rs {
            path.push(name);
        }
        let raw = std::fs::read_to_string(&file).expect("read source");
        // `#[path]` test files are part of their parent's module.
        let is_test_file =
            raw.contains("use super::*;") && path.last().is_some_and(|n| n.ends_with("tests"));
        let code = strip(&raw);
        mods.push(Module {
            path,
            code,
            raw,
            file,
            is_mod_rs,
            is_test_file,
        });
    }
    mods
}

/// The deepest known module a path names, e.g. `delay::hold::run` → `delay::hold`.
fn resolve(known: &BTreeSet<Vec<String>>, segs: &[&str]) -> Option<Vec<String>> {
    let mut best = None;
    for n in 1..=segs.len() {
        let p: Vec<String> = segs[..n].iter().map(|s| s.to_string()).collect();
        if known.contains(&p) {
            best = Some(p);
        }
    }
    best
}

fn path_at(code: &str, start: usize) -> Vec<&str> {
    let rest = &code[start..];
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(rest.len());
    rest[..end].split("::").filter(|s| !s.is_empty()).collect()
}

/// Whether the line holding byte `at` re-exports (`pub use`) or declares a module.
fn is_reexport_or_mod(code: &str, at: usize) -> bool {
    let line_start = code[..at].rfind('\n').map_or(0, |i| i + 1);
    let line = code[line_start..].trim_start();
    line.starts_with("pub use") || line.starts_with("pub(crate) use") || line.starts_with("mod ")
}

fn imports(m: &Module, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    // A file's inline `mod tests` (last in the file) imports for tests only;
    // its `super::*` is the file itself.
    let code = match m.code.find("#[cfg(test)]\nmod ") {
        Some(i) => &m.code[..i],
        None => &m.code[..],
    };
    let mut prefixes: Vec<(String, Vec<String>)> = vec![
        ("crate::".into(), vec![]),
        (
            "super::".into(),
            m.path[..m.path.len().saturating_sub(1)].to_vec(),
        ),
    ];
    if m.is_mod_rs {
        for child in known
            .iter()
            .filter(|k| k.len() == m.path.len() + 1 && k.starts_with(&m.path))
        {
            let name = child.last().expect("child name");
            prefixes.push((format!("{name}::"), m.path.clone()));
        }
    }
    for (prefix, base) in &prefixes {
        for (at, _) in code.match_indices(prefix.as_str()) {
            let before = code[..at].chars().last().unwrap_or(' ');
            if before.is_alphanumeric() || before == '_' || (before == ':' && prefix != "crate::") {
                continue;
            }
            if is_reexport_or_mod(code, at) {
                continue;
            }
            let tail = path_at(code, at + prefix.len());
            let mut segs: Vec<&str> = base.iter().map(String::as_str).collect();
            if prefix != "crate::" && prefix != "super::" {
                segs.push(prefix.trim_end_matches("::"));
            }
            segs.extend(tail);
            if let Some(target) = resolve(known, &segs) {
                if target != m.path {
                    out.insert(target);
                }
            }
        }
    }
    out
}

fn graph() -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mods: Vec<Module> = modules().into_iter().filter(|m| !m.is_test_file).collect();
    let known: BTreeSet<Vec<String>> = mods.iter().map(|m| m.path.clone()).collect();
    mods.iter()
        .map(|m| (m.path.clone(), imports(m, &known)))
        .collect()
}

#[test]
fn layers_import_only_lower_layers() {
    let rank = |m: &[String]| {
        LAYERS
            .iter()
            .position(|l| m.first().is_some_and(|f| f == l))
    };
    let mut bad = Vec::new();
    for (from, tos) in graph() {
        let Some(rf) = rank(&from) else {
            bad.push(format!("{} is not in LAYERS", from.join("::")));
            continue;
        };
        for to in tos {
            match rank(&to) {
                Some(rt) if rt < rf || to[0] == from[0] => {}
                _ => bad.push(format!("{} imports {}", from.join("::"), to.join("::"))),
            }
        }
    }
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

/// Every cycle's modules, found by depth-first search.
fn cycles(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<String> {
    fn visit(
        n: &Vec<String>,
        g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
        found: &mut Vec<String>,
    ) {
        if let Some(i) = stack.iter().position(|s| s == n) {
            let c: Vec<String> = stack[i..].iter().map(|p| p.join("::")).collect();
            found.push(format!("{} -> {}", c.join(" -> "), n.join("::")));
            return;
        }
        if !done.insert(n.clone()) {
            return;
        }
        stack.push(n.clone());
        for m in g.get(n).into_iter().flatten() {
            visit(m, g, stack, done, found);
        }
        stack.pop();
    }
    let (mut done, mut found) = (BTreeSet::new(), Vec::new());
    for n in g.keys() {
        visit(n, g, &mut Vec::new(), &mut done, &mut found);
    }
    found
}

#[test]
fn no_module_imports_one_that_imports_it_back() {
    let found = cycles(&graph());
    assert!(found.is_empty(), "import cycles:\n{}", found.join("\n"));
}

/// The lines of each `fn` from its signature to its closing brace.
fn long_functions(m: &Module) -> Vec<String> {
    let lines: Vec<&str> = m.code.lines().collect();
    let mut out = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        let t = line.trim_start();
        let is_fn = t.split_whitespace().take_while(|w| *w != "fn").all(|w| {
            matches!(w, "pub" | "async" | "const" | "unsafe" | "extern") || w.starts_with("pub(")
        }) && t.split_whitespace().any(|w| w == "fn");
        if !is_fn || !(t.starts_with("fn ") || t.contains(" fn ")) {
            continue;
        }
        let (mut depth, mut opened) = (0i32, false);
        for (j, l) in lines.iter().enumerate().skip(i) {
            for c in l.chars() {
                match c {
                    '{' => (depth, opened) = (depth + 1, true),
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if !opened && l.trim_end().ends_with(';') {
                break;
            }
            if opened && depth <= 0 {
                let n = j - i + 1;
                if n > MAX_FN_LINES {
                    let name = m
                        .file
                        .strip_prefix(src())
                        .unwrap_or(&m.file)
                        .display()
                        .to_string();
                    out.push(format!("src/{name}:{}: {n} lines", i + 1));
                }
                break;
            }
        }
    }
    out
}

#[test]
fn no_function_is_over_sixty_lines() {
    let long: Vec<String> = modules().iter().flat_map(long_functions).collect();
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

/// The checker itself finds what it should, so a green run means something.
#[test]
fn the_checker_sees_imports_and_cycles() {
    let g = graph();
    let worker = g.get(&vec!["worker".to_string()]).expect("worker module");
    assert!(
        worker.iter().any(|t| t[0] == "policy"),
        "worker uses policy: {worker:?}"
    );
    let mut fake = BTreeMap::new();
    let (a, b) = (vec!["a".to_string()], vec!["b".to_string()]);
    fake.insert(a.clone(), BTreeSet::from([b.clone()]));
    fake.insert(b, BTreeSet::from([a]));
    assert_eq!(cycles(&fake).len(), 1);
    assert!(strip("let s = \"crate::x\"; // crate::y")
        .trim()
        .ends_with(';'));
    assert!(modules().iter().any(|m| m.raw.contains("fn ")));
}
