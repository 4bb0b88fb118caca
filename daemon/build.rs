//! Build script: the git commit that `plexus --version` shows, as `PLEXUS_GIT_COMMIT`.
//!
//! Taken from `PLEXUS_GIT_COMMIT` when the builder sets it (a container build or a
//! source tarball has no `.git`), else from `git rev-parse`, else "unknown": a build
//! never fails for want of git.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-env-changed=PLEXUS_GIT_COMMIT");
    let commit = match std::env::var("PLEXUS_GIT_COMMIT") {
        Ok(commit) if !commit.trim().is_empty() => commit.trim().to_string(),
        _ => from_git().unwrap_or_else(|| "unknown".to_string()),
    };
    println!("cargo:rustc-env=PLEXUS_GIT_COMMIT={commit}");
}

/// The abbreviated commit of HEAD, and the files whose change moves it watched, so
/// a commit or a checkout runs this script again (and nothing else does).
fn from_git() -> Option<String> {
    let commit = git(&["rev-parse", "--short=12", "HEAD"])?;
    let mut watched = vec![git_path("HEAD")?, git_path("packed-refs")?];
    if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
        watched.extend(git_path(&branch));
    }
    for path in watched {
        // A file that does not exist (no packed-refs yet) would rerun every build.
        if Path::new(&path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    Some(commit)
}

/// Where git keeps `name` (a worktree's HEAD is its own, its branches are shared).
fn git_path(name: &str) -> Option<String> {
    git(&["rev-parse", "--path-format=absolute", "--git-path", name])
}

fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok()?;
    let text = String::from_utf8(output.stdout).ok()?;
    (output.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}
