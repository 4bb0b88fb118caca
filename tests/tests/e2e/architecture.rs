//! Each crate's modules form no import cycle (each uses only modules below it), no two
//! files import each other, and no file holds more than 800 lines of code, so
//! the layering ARCHITECTURE.md draws holds as the code grows; and no task is
//! spawned untracked.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A file's code before its tests: none for a file that is a test module
/// altogether (`#![cfg(test)]` at its top level), else what comes before the first
/// `#[cfg(test)]`.
fn non_test_code(text: &str) -> &str {
    if text.lines().any(|line| line == "#![cfg(test)]") {
        return "";
    }
    text.split("#[cfg(test)]").next().unwrap_or_default()
}

/// Top-level module → the top-level modules its non-test code names as `crate::x`.
fn module_graph(src: &Path) -> anyhow::Result<BTreeMap<String, BTreeSet<String>>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(path) = stack.pop() {
        for entry in std::fs::read_dir(&path)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            let relative = path.strip_prefix(src)?;
            let first = relative
                .components()
                .next()
                .and_then(|c| c.as_os_str().to_str())
                .unwrap_or_default();
            let module = first.trim_end_matches(".rs").to_string();
            // The crate roots name every module (the daemon's lib.rs hands each
            // command to its runner): they are above every layer, not one of them.
            if module == "main" || module == "lib" {
                continue;
            }
            let text = std::fs::read_to_string(&path)?;
            // Tests may reach anywhere.
            let code = non_test_code(&text);
            let uses = graph.entry(module.clone()).or_default();
            for (at, _) in code.match_indices("crate::") {
                let name: String = code[at + "crate::".len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                if !name.is_empty() && name != module {
                    uses.insert(name);
                }
            }
        }
    }
    Ok(graph)
}

/// A cycle through `start`, if there is one, as the path of module names.
fn cycle_from(
    graph: &BTreeMap<String, BTreeSet<String>>,
    start: &str,
    path: &mut Vec<String>,
) -> Option<Vec<String>> {
    let current = path.last()?.clone();
    for next in graph.get(&current).into_iter().flatten() {
        if next == start {
            let mut cycle = path.clone();
            cycle.push(next.clone());
            return Some(cycle);
        }
        if graph.contains_key(next) && !path.contains(next) {
            path.push(next.clone());
            if let Some(cycle) = cycle_from(graph, start, path) {
                return Some(cycle);
            }
            path.pop();
        }
    }
    None
}

/// Fails if the modules of `crate_dir/src` import each other in a circle.
fn no_circle_in(crate_dir: &str, at_least: usize) -> anyhow::Result<()> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let graph = module_graph(&src)?;
    anyhow::ensure!(
        graph.len() >= at_least && graph.values().any(|uses| !uses.is_empty()),
        "read too little of {}: {graph:?}",
        src.display()
    );
    for module in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, module, &mut vec![module.clone()]) {
            anyhow::bail!(
                "modules of {crate_dir}/src import each other in a circle: {}",
                cycle.join(" → ")
            );
        }
    }
    Ok(())
}

#[test]
fn daemon_modules_import_each_other_in_no_circle() -> anyhow::Result<()> {
    no_circle_in("daemon", 10)
}

#[test]
fn adapters_and_registry_modules_import_each_other_in_no_circle() -> anyhow::Result<()> {
    no_circle_in("adapters", 6)?;
    no_circle_in("registry", 5)
}

/// The crate-relative module path of a source file: `a/b.rs` and `a/b/mod.rs` are
/// both `a::b`; `lib.rs` and `main.rs` are the root.
fn module_of(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .with_extension("")
        .components()
        .filter_map(|c| c.as_os_str().to_str().map(str::to_string))
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// The file that holds module `parts` or, failing that, its nearest ancestor that
/// is a file of its own (`a::b::C` names `a/b.rs`, `a/b/mod.rs`, `a.rs` or `a/mod.rs`).
fn file_of(src: &Path, parts: &[String]) -> Option<std::path::PathBuf> {
    (1..=parts.len()).rev().find_map(|n| {
        let stem: std::path::PathBuf = parts[..n].iter().collect();
        [
            src.join(&stem).with_extension("rs"),
            src.join(&stem).join("mod.rs"),
        ]
        .into_iter()
        .find(|candidate| candidate.is_file())
    })
}

/// Every source file of `src` (relative path → its non-test code).
fn sources(src: &Path) -> anyhow::Result<BTreeMap<std::path::PathBuf, String>> {
    let mut files = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("rs") {
                let text = std::fs::read_to_string(&path)?;
                let code = non_test_code(&text);
                files.insert(path.strip_prefix(src)?.to_path_buf(), code.to_string());
            }
        }
    }
    Ok(files)
}

/// File → the other files of the crate its non-test code names through `crate::`,
/// `super::` or `self::` paths. A folder's `mod.rs` and its own children may name
/// each other (the module and its parts), so those edges are left out.
fn file_graph(
    src: &Path,
) -> anyhow::Result<BTreeMap<std::path::PathBuf, BTreeSet<std::path::PathBuf>>> {
    let files = sources(src)?;
    let mut graph = BTreeMap::new();
    for (relative, code) in &files {
        let here = module_of(relative);
        let is_root_of_folder = matches!(
            relative.file_name().and_then(|n| n.to_str()),
            Some("mod.rs" | "lib.rs" | "main.rs")
        );
        let mut uses = BTreeSet::new();
        for start in ["crate::", "super::", "self::"] {
            for (at, _) in code.match_indices(start) {
                // Only a path's first segment: `super::super::x` is read from its start.
                if at > 0 && code[..at].ends_with("::") {
                    continue;
                }
                let path: String = code[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                    .collect();
                let mut segments: Vec<&str> = path.split("::").filter(|s| !s.is_empty()).collect();
                let mut base: Vec<String> = match segments.first().copied() {
                    Some("crate") => Vec::new(),
                    Some("self") => here.clone(),
                    _ => {
                        let mut up = here.clone();
                        up.pop();
                        up
                    }
                };
                segments.remove(0);
                while segments.first() == Some(&"super") {
                    base.pop();
                    segments.remove(0);
                }
                base.extend(
                    segments
                        .iter()
                        .take_while(|s| s.chars().next().is_some_and(|c| c.is_ascii_lowercase()))
                        .map(|s| s.to_string()),
                );
                let Some(target) = file_of(src, &base) else {
                    continue;
                };
                let target = target.strip_prefix(src)?.to_path_buf();
                if &target == relative {
                    continue;
                }
                let target_module = module_of(&target);
                // Parent and child: the folder's mod.rs and a file directly in it.
                let parent_child = (is_root_of_folder
                    && target_module.len() == here.len() + 1
                    && target_module.starts_with(&here))
                    || (target.file_name().and_then(|n| n.to_str()) == Some("mod.rs")
                        && here.len() == target_module.len() + 1
                        && here.starts_with(&target_module));
                if !parent_child {
                    uses.insert(target);
                }
            }
        }
        graph.insert(relative.clone(), uses);
    }
    Ok(graph)
}

/// Fails if two files of `crate_dir/src` import each other, directly or around a
/// circle of files (beyond a module and its own parts).
fn no_file_circle_in(crate_dir: &str) -> anyhow::Result<()> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(crate_dir)
        .join("src");
    let graph: BTreeMap<String, BTreeSet<String>> = file_graph(&src)?
        .into_iter()
        .map(|(file, uses)| {
            (
                file.display().to_string(),
                uses.iter().map(|u| u.display().to_string()).collect(),
            )
        })
        .collect();
    anyhow::ensure!(
        graph.values().any(|uses| !uses.is_empty()),
        "read no import in {}",
        src.display()
    );
    for file in graph.keys() {
        if let Some(cycle) = cycle_from(&graph, file, &mut vec![file.clone()]) {
            anyhow::bail!(
                "files of {crate_dir}/src import each other in a circle: {}",
                cycle.join(" → ")
            );
        }
    }
    Ok(())
}

#[test]
fn no_files_import_each_other_in_a_circle() -> anyhow::Result<()> {
    for crate_dir in ["daemon", "adapters", "registry"] {
        no_file_circle_in(crate_dir)?;
    }
    Ok(())
}

/// The most lines of code (tests apart) one source file may hold: past it a file
/// holds more than one concern, and the next reader gets lost in it.
const MOST_LINES_OF_CODE: usize = 800;

#[test]
fn no_source_file_holds_more_than_800_lines_of_code() -> anyhow::Result<()> {
    let mut over = Vec::new();
    for crate_dir in ["daemon", "adapters", "registry"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(crate_dir)
            .join("src");
        for (file, code) in sources(&src)? {
            let lines = code.lines().count();
            if lines > MOST_LINES_OF_CODE {
                over.push(format!("{crate_dir}/src/{}: {lines}", file.display()));
            }
        }
    }
    anyhow::ensure!(
        over.is_empty(),
        "source files over {MOST_LINES_OF_CODE} lines of code: {}",
        over.join(", ")
    );
    Ok(())
}

/// Files whose non-test code may start a task with `tokio::spawn`: none. Every task
/// is started on a `TaskTracker` or `JoinSet` owned by whoever owns its lifetime,
/// so shutdown can wait for it and cancel it.
const UNTRACKED_SPAWN_ALLOWED: &[&str] = &[];

#[test]
fn no_task_is_spawned_untracked() -> anyhow::Result<()> {
    let mut untracked = Vec::new();
    let mut read = 0;
    for crate_dir in ["daemon", "adapters"] {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(crate_dir)
            .join("src");
        for (file, code) in sources(&src)? {
            read += 1;
            let name = format!("{crate_dir}/src/{}", file.display());
            if UNTRACKED_SPAWN_ALLOWED.contains(&name.as_str()) {
                continue;
            }
            for (number, line) in code.lines().enumerate() {
                if line.contains("tokio::spawn(") || line.contains("tokio::task::spawn(") {
                    untracked.push(format!("{name}:{}", number + 1));
                }
            }
        }
    }
    anyhow::ensure!(read >= 20, "read too few source files: {read}");
    anyhow::ensure!(
        untracked.is_empty(),
        "tasks spawned untracked (use the owner's TaskTracker or a JoinSet): {}",
        untracked.join(", ")
    );
    Ok(())
}
