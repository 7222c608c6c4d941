//! A crate's module graph read from its sources, for the layout tests of probe-user and the
//! shim: no import circles among modules (files) or stages (top-level folders), no mutable
//! globals. A module's imports are the `crate::…`, `super::…` and `self::…` paths in its source
//! (use trees expanded), each resolved to the longest module path it names.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

pub fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(dir).expect("src readable").flatten() {
        let p = e.path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs` → `a::b`, `src/a/mod.rs` → `a`; lib.rs and main.rs are the root.
fn module_of(src: &Path, file: &Path) -> Option<String> {
    let rel = file.strip_prefix(src).ok()?.with_extension("");
    let parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let parts: Vec<String> = match parts.last().map(String::as_str) {
        Some("mod") => parts[..parts.len() - 1].to_vec(),
        Some("lib" | "main") if parts.len() == 1 => return None,
        _ => parts,
    };
    Some(parts.join("::"))
}

/// Source without comments and string literals (paths in docs are not imports).
pub fn code_only(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('"', '\n'); lifetimes ('a) are left alone.
            let end = b[i + 1..]
                .iter()
                .position(|&c| c == b'\'')
                .map_or(b.len(), |p| i + 2 + p);
            i = end;
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// Expands the path or use tree starting at `s` (just after `crate::` etc.) into full paths.
fn expand(s: &str, prefix: &str, out: &mut Vec<String>) -> usize {
    let mut path = prefix.to_string();
    let b = s.as_bytes();
    let mut i = 0;
    loop {
        let start = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        let seg = &s[start..i];
        if !seg.is_empty() {
            if !path.is_empty() {
                path.push_str("::");
            }
            path.push_str(seg);
        }
        let group = if seg.is_empty() && s[i..].starts_with('{') {
            Some(1)
        } else if s[i..].starts_with("::{") {
            Some(3)
        } else {
            None
        };
        if let Some(skip) = group {
            i += skip;
            loop {
                while i < b.len() && (b[i] as char).is_whitespace() {
                    i += 1;
                }
                if i < b.len() && b[i] == b'}' {
                    return i + 1;
                }
                i += expand(&s[i..], &path, out);
                while i < b.len() && (b[i] as char).is_whitespace() {
                    i += 1;
                }
                if i < b.len() && b[i] == b',' {
                    i += 1;
                } else if i < b.len() && b[i] == b'}' {
                    return i + 1;
                } else {
                    return i;
                }
            }
        } else if s[i..].starts_with("::") {
            i += 2;
        } else {
            out.push(path);
            // `as x`, or the end of this path.
            while i < b.len() && !matches!(b[i], b',' | b'}' | b';' | b'(' | b')') {
                if b[i] == b'{' {
                    break;
                }
                i += 1;
            }
            return i;
        }
    }
}

/// Module → modules it imports.
pub fn imports(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let modules: BTreeSet<String> = files.iter().filter_map(|f| module_of(src, f)).collect();
    let mut graph = BTreeMap::new();
    for f in &files {
        let Some(me) = module_of(src, f) else {
            continue;
        };
        let is_mod_rs = f.file_name().is_some_and(|n| n == "mod.rs");
        let text = code_only(&fs::read_to_string(f).expect("source readable"));
        let mut paths = Vec::new();
        // An inline `mod tests { … }` ends the file's own code: `super::` inside it is the
        // file's module itself.
        let tests_at = text.find("mod tests {").unwrap_or(text.len());
        let parent = {
            // `super` of a/b.rs (module a::b) is `a`; of a/b/mod.rs (also a::b) too.
            let parts: Vec<&str> = me.split("::").collect();
            let _ = is_mod_rs;
            parts[..parts.len() - 1].join("::")
        };
        for (kw, base) in [
            ("crate::", String::new()),
            ("super::", parent),
            ("self::", me.clone()),
        ] {
            let mut at = 0;
            while let Some(p) = text[at..].find(kw) {
                let i = at + p;
                let base = if kw == "super::" && i > tests_at {
                    me.clone()
                } else {
                    base.clone()
                };
                let preceded = i > 0 && {
                    let c = text.as_bytes()[i - 1];
                    c.is_ascii_alphanumeric() || c == b'_' || c == b':'
                };
                at = i + kw.len();
                if preceded {
                    continue;
                }
                expand(&text[at..], &base, &mut paths);
            }
        }
        let mut deps = BTreeSet::new();
        for p in paths {
            let parts: Vec<&str> = p.split("::").collect();
            let target = (1..=parts.len())
                .rev()
                .map(|n| parts[..n].join("::"))
                .find(|m| modules.contains(m));
            if let Some(t) = target
                && t != me
            {
                deps.insert(t);
            }
        }
        graph.insert(me, deps);
    }
    graph
}

/// Every cycle's members, as strongly connected components of more than one node.
pub fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Reachability is enough at this size (~60 modules).
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut todo = vec![from.clone()];
        while let Some(n) = todo.pop() {
            for d in graph.get(&n).into_iter().flatten() {
                if seen.insert(d.clone()) {
                    todo.push(d.clone());
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|k| (k, reach(k))).collect();
    let mut done = BTreeSet::new();
    let mut out = Vec::new();
    for a in graph.keys() {
        if done.contains(a) || !reaches[a].contains(a) {
            continue;
        }
        let comp: Vec<String> = graph
            .keys()
            .filter(|b| reaches[a].contains(*b) && reaches[*b].contains(a))
            .cloned()
            .collect();
        done.extend(comp.iter().cloned());
        out.push(comp);
    }
    out
}

pub fn explain(graph: &BTreeMap<String, BTreeSet<String>>, comp: &[String]) -> String {
    comp.iter()
        .map(|m| {
            let inside: Vec<&String> = graph[m].iter().filter(|d| comp.contains(d)).collect();
            format!("{m} → {inside:?}")
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Module → stage (its top-level folder or file).
pub fn stage_graph(src: &Path) -> BTreeMap<String, BTreeSet<String>> {
    let stage = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (m, deps) in imports(src) {
        let s = stage(&m);
        let e = graph.entry(s.clone()).or_default();
        e.extend(deps.iter().map(|d| stage(d)).filter(|d| *d != s));
    }
    graph
}

/// The circles of `graph`, explained, one a line (empty: none).
pub fn circles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<String> {
    cycles(graph).iter().map(|c| explain(graph, c)).collect()
}

/// `static`s that can change (an atomic, a lock, a cell, `static mut`) and thread-locals in
/// the crate's sources, but for the files `allowed` (by name).
pub fn mutable_globals(src: &Path, allowed: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    sources(src, &mut files);
    let mut found = Vec::new();
    for f in files {
        if allowed.iter().any(|a| f.ends_with(a)) {
            continue;
        }
        let text = code_only(&fs::read_to_string(&f).expect("source readable"));
        for line in text.lines() {
            let t = line.trim_start();
            let is_static = t.starts_with("static ")
                || t.starts_with("pub static ")
                || t.starts_with("pub(crate) static ")
                || t.starts_with("pub(super) static ");
            let mutable = t.contains("static mut ")
                || [
                    "Atomic", "Mutex", "RwLock", "Cell", "OnceLock", "LazyLock", "Lazy<", "Once ",
                    "Once=", "Once =",
                ]
                .iter()
                .any(|k| t.contains(k));
            if (is_static && mutable) || t.starts_with("thread_local!") {
                found.push(format!("{}: {}", f.display(), t));
            }
        }
    }
    found
}
