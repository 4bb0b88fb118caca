//! Each crate's modules form no import cycle: each uses only modules below it, so
//! the layering ARCHITECTURE.md draws holds as the code grows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

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
            let code = text.split("#[cfg(test)]").next().unwrap_or_default();
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
