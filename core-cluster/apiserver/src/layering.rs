//! The layering of the crate, checked on its sources: `api` (HTTP) above `auth` (authn,
//! authz, admission plugins) above `storage` (the generic object store) above `registry`
//! and `store`. The test parses every file of `src/` with syn, resolves each `crate::…`,
//! `super::…`, `self::…` and child-module path (in `use` items and in code alike) to the
//! file that defines its module, and fails naming the offending pair when
//!
//! - a file of `auth`, `registry` or `storage` imports `api`;
//! - two top-level modules import each other;
//! - two files of `api`, `auth`, `registry` or `storage` import each other (a `mod.rs` and
//!   the files it declares are one module and may: the children use the types their
//!   parent defines).
//!
//! `registry` and `store` are crates of their own (`core-cluster-machinery`,
//! `core-cluster-store`) below this one, so Cargo already refuses their importing `api`.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::{Path, PathBuf},
};

use syn::{
    buffer::Cursor,
    parse::{ParseStream, Parser},
};

/// A module's path from the crate root: `["api", "handlers"]`.
type ModPath = Vec<String>;

/// One source file: its module path and whether it is a `mod.rs` (or `lib.rs`).
#[derive(Debug, Clone)]
struct SourceFile {
    module: ModPath,
    is_dir_module: bool,
    path: PathBuf,
}

fn source_files(dir: &Path, module: &[String], out: &mut Vec<SourceFile>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .expect("src/ is readable")
        .map(|e| e.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or("")
            .to_owned();
        if path.is_dir() {
            let mut sub = module.to_vec();
            sub.push(name);
            source_files(&path, &sub, out);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            let (module, is_dir_module) = match stem {
                "mod" | "lib" => (module.to_vec(), true),
                _ => {
                    let mut m = module.to_vec();
                    m.push(stem.to_owned());
                    (m, false)
                }
            };
            out.push(SourceFile {
                module,
                is_dir_module,
                path,
            });
        }
    }
}

/// Every path a file names: its segments as written (`crate`, `super`, `self` or a name
/// first), with the module it is written in (inline `mod` blocks included).
fn named_paths(source: &str, module: &[String]) -> Vec<(ModPath, Vec<String>)> {
    let parser = |input: ParseStream<'_>| {
        input.step(|cursor| {
            let mut out = Vec::new();
            walk(*cursor, module, &mut out);
            let mut rest = *cursor;
            while let Some((_, next)) = rest.token_tree() {
                rest = next;
            }
            Ok((out, rest))
        })
    };
    parser.parse_str(source).expect("every source file parses")
}

/// The tokens from `cursor` on, as a list of token trees.
fn trees(mut cursor: Cursor<'_>) -> Vec<Cursor<'_>> {
    let mut out = Vec::new();
    while let Some((_, next)) = cursor.token_tree() {
        out.push(cursor);
        cursor = next;
    }
    out
}

/// Whether the trees at `i` and `i + 1` are `::`.
fn colons(trees: &[Cursor<'_>], i: usize) -> bool {
    let punct = |j: usize| {
        trees
            .get(j)
            .and_then(|c| c.punct())
            .map(|(p, _)| p.as_char())
    };
    punct(i) == Some(':') && punct(i + 1) == Some(':')
}

fn walk(cursor: Cursor<'_>, module: &[String], out: &mut Vec<(ModPath, Vec<String>)>) {
    let trees = trees(cursor);
    let mut i = 0;
    while i < trees.len() {
        let c = trees[i];
        if let Some((ident, _)) = c.ident() {
            let name = ident.to_string();
            // An inline module: its paths are relative to it.
            if name == "mod"
                && let Some((inner, _)) = trees.get(i + 1).and_then(|c| c.ident())
                && let Some(body) = trees.get(i + 2).and_then(|c| brace(*c))
            {
                let mut sub = module.to_vec();
                sub.push(inner.to_string());
                walk(body, &sub, out);
                i += 3;
                continue;
            }
            // The start of a path: `a::b…` not preceded by `::`.
            let preceded = i >= 2 && colons(&trees, i - 2);
            if !preceded && colons(&trees, i + 1) {
                let mut prefixes = Vec::new();
                let next = path_from(&trees, i, vec![], &mut prefixes);
                for p in prefixes {
                    out.push((module.to_vec(), p));
                }
                i = next;
                continue;
            }
        } else if let Some((inner, _, _, _)) = c.any_group() {
            walk(inner, module, out);
        }
        i += 1;
    }
}

/// The inside of a `{…}` group at `cursor`.
fn brace(cursor: Cursor<'_>) -> Option<Cursor<'_>> {
    let (inner, delimiter, _, _) = cursor.any_group()?;
    (format!("{delimiter:?}") == "Brace").then_some(inner)
}

/// Reads the path starting at `trees[i]` (a name followed by `::`), expanding `use` groups
/// (`a::{b, c::d}`); returns the index after it.
fn path_from(
    trees: &[Cursor<'_>],
    mut i: usize,
    mut segments: Vec<String>,
    out: &mut Vec<Vec<String>>,
) -> usize {
    loop {
        match trees.get(i).and_then(|c| c.ident()) {
            Some((ident, _)) => {
                segments.push(ident.to_string());
                i += 1;
            }
            None => {
                if let Some(group) = trees.get(i).and_then(|c| brace(*c)) {
                    // `{a, b::c}`: each item continues the path.
                    let inner = self::trees(group);
                    let mut j = 0;
                    while j < inner.len() {
                        if inner[j].ident().is_some() {
                            j = path_from(&inner, j, segments.clone(), out);
                        } else {
                            j += 1;
                        }
                    }
                    return i + 1;
                }
                break;
            }
        }
        if colons(trees, i) {
            i += 2;
        } else {
            break;
        }
    }
    out.push(segments);
    i
}

/// The file module `path` (written in `module`) names, if it names one of `modules`.
fn resolve(module: &[String], path: &[String], modules: &BTreeSet<ModPath>) -> Option<ModPath> {
    let (mut base, rest): (ModPath, &[String]) = match path.first().map(String::as_str) {
        Some("crate") => (vec![], &path[1..]),
        Some("self") => (module.to_vec(), &path[1..]),
        Some("super") => {
            let mut base = module.to_vec();
            let mut rest = path;
            while rest.first().map(String::as_str) == Some("super") {
                base.pop();
                rest = &rest[1..];
            }
            (base, rest)
        }
        Some(first) => {
            // A child module of the current one, named without a prefix.
            let mut child = module.to_vec();
            child.push(first.to_owned());
            if !modules.contains(&child) {
                return None;
            }
            (module.to_vec(), path)
        }
        None => return None,
    };
    let mut found = None;
    for segment in rest {
        base.push(segment.clone());
        if modules.contains(&base) {
            found = Some(base.clone());
        } else {
            break;
        }
    }
    found
}

/// The file that defines `module`, if any: the innermost known file module it is in.
fn file_of(module: &[String], files: &BTreeMap<ModPath, SourceFile>) -> Option<ModPath> {
    (0..=module.len())
        .rev()
        .map(|n| module[..n].to_vec())
        .find(|m| files.contains_key(m))
}

/// Which file imports which: (importer, imported) by module path, with a path of each.
fn imports() -> (
    BTreeMap<(ModPath, ModPath), String>,
    BTreeMap<ModPath, SourceFile>,
) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    source_files(&root, &[], &mut files);
    let by_module: BTreeMap<ModPath, SourceFile> = files
        .iter()
        .map(|f| (f.module.clone(), f.clone()))
        .collect();
    let modules: BTreeSet<ModPath> = by_module.keys().cloned().collect();
    let mut edges = BTreeMap::new();
    for file in &files {
        let source = std::fs::read_to_string(&file.path).expect("a readable source file");
        for (written_in, path) in named_paths(&source, &file.module) {
            let Some(target) = resolve(&written_in, &path, &modules) else {
                continue;
            };
            let Some(to) = file_of(&target, &by_module) else {
                continue;
            };
            // The crate root's re-exports say nothing of the layers.
            if to.is_empty() || to == file.module {
                continue;
            }
            edges
                .entry((file.module.clone(), to))
                .or_insert_with(|| path.join("::"));
        }
    }
    (edges, by_module)
}

fn name(module: &[String]) -> String {
    if module.is_empty() {
        "lib.rs".to_owned()
    } else {
        module.join("::")
    }
}

/// What the [module docs](self) say the layers are; each refusal names the pair.
fn violations(
    edges: &BTreeMap<(ModPath, ModPath), String>,
    files: &BTreeMap<ModPath, SourceFile>,
) -> Vec<String> {
    let top = |m: &ModPath| m.first().cloned().unwrap_or_default();
    let layered = ["api", "auth", "registry", "storage"];
    let mut found = Vec::new();
    for ((from, to), path) in edges {
        if ["auth", "registry", "storage"].contains(&top(from).as_str()) && top(to) == "api" {
            found.push(format!(
                "{} imports {} (`{path}`): auth, registry and storage are below api",
                name(from),
                name(to)
            ));
        }
    }
    let mut top_edges: BTreeMap<(String, String), String> = BTreeMap::new();
    for ((from, to), path) in edges {
        let (a, b) = (top(from), top(to));
        if a != b && !a.is_empty() && !b.is_empty() {
            top_edges
                .entry((a, b))
                .or_insert_with(|| format!("{} -> `{path}`", name(from)));
        }
    }
    for ((a, b), path) in &top_edges {
        if a < b
            && let Some(back) = top_edges.get(&(b.clone(), a.clone()))
        {
            found.push(format!(
                "the modules {a} and {b} import each other: {path}; {back}"
            ));
        }
    }
    for ((from, to), path) in edges {
        if from >= to || !layered.contains(&top(from).as_str()) {
            continue;
        }
        let Some(back) = edges.get(&(to.clone(), from.clone())) else {
            continue;
        };
        // A directory module and the files it declares are one module.
        let parent_of = |p: &ModPath, c: &ModPath| {
            files.get(p).is_some_and(|f| f.is_dir_module) && c.starts_with(p)
        };
        if parent_of(from, to) || parent_of(to, from) {
            continue;
        }
        found.push(format!(
            "the files {} and {} import each other: `{path}`; `{back}`",
            name(from),
            name(to)
        ));
    }
    found
}

/// The layers of the [module docs](self) hold.
#[test]
fn no_layer_imports_one_above_it_and_no_two_modules_import_each_other() {
    let (edges, files) = imports();
    assert!(
        edges.contains_key(&(
            vec!["api".into(), "handlers".into()],
            vec!["storage".into()]
        )),
        "the scan sees api's imports of storage"
    );
    let found = violations(&edges, &files);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The check itself: an import of `api` from below, and a pair of files that import
/// each other, are named.
#[test]
fn the_layering_check_names_the_offending_pair() {
    let module = |s: &str| -> ModPath { s.split("::").map(str::to_owned).collect() };
    let file = |m: &str, dir: bool| SourceFile {
        module: module(m),
        is_dir_module: dir,
        path: PathBuf::new(),
    };
    let files: BTreeMap<ModPath, SourceFile> = [
        file("api", true),
        file("api::handlers", false),
        file("storage", true),
        file("storage::create", false),
        file("storage::update", false),
    ]
    .into_iter()
    .map(|f| (f.module.clone(), f))
    .collect();
    let mut edges = BTreeMap::new();
    edges.insert(
        (module("api::handlers"), module("storage")),
        "crate::storage".into(),
    );
    edges.insert(
        (module("storage::create"), module("api")),
        "crate::api::ServerState".into(),
    );
    edges.insert(
        (module("storage::create"), module("storage::update")),
        "super::update".into(),
    );
    edges.insert(
        (module("storage::update"), module("storage::create")),
        "super::create".into(),
    );
    // The parent and its files may use each other.
    edges.insert(
        (module("storage"), module("storage::create")),
        "create".into(),
    );
    edges.insert(
        (module("storage::update"), module("storage")),
        "super::Storage".into(),
    );
    let found = violations(&edges, &files);
    assert_eq!(found.len(), 3, "{found:?}");
    assert!(
        found[0].contains("storage::create imports api"),
        "{found:?}"
    );
    assert!(
        found[1].contains("the modules api and storage import each other"),
        "{found:?}"
    );
    assert!(
        found[2].contains("the files storage::create and storage::update import each other"),
        "{found:?}"
    );
    // Paths in use groups, inline modules and code are all seen.
    let paths = named_paths(
        "use crate::{a::b, c}; fn f() { super::d::e(); } mod tests { use super::*; }",
        &module("x::y"),
    );
    let written: Vec<String> = paths
        .iter()
        .map(|(m, p)| format!("{}:{}", m.join("::"), p.join("::")))
        .collect();
    assert_eq!(
        written,
        [
            "x::y:crate::a::b",
            "x::y:crate::c",
            "x::y:super::d::e",
            "x::y::tests:super"
        ]
    );
}
