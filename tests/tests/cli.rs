//! The `plexus` command line: `check-config` on the shipped and on broken files.

use std::process::Command;

use anyhow::ensure;
use plexus_tests::plexus_binary;

fn check_config(path: &std::path::Path) -> anyhow::Result<(i32, String, String)> {
    let output = Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(path)
        .output()?;
    Ok((
        output.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    ))
}

#[test]
fn the_shipped_config_passes_check_config() -> anyhow::Result<()> {
    let shipped = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../config.toml");
    let (code, stdout, stderr) = check_config(&shipped)?;
    ensure!(code == 0, "exit {code}: {stderr}");
    ensure!(stdout.contains("valid"), "{stdout}");
    Ok(())
}

#[test]
fn check_config_lists_every_error_and_exits_64() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[daemon]\nlisten = \"nowhere\"\n[upstreams.Bad]\ncommand = \"x\"\n[upstreams.two]\nuvx = \"a\"\nnpx = \"b\"\n[upstreams.typo]\ncomand = \"x\"\n",
    )?;
    let (code, _, stderr) = check_config(&path)?;
    ensure!(code == 64, "exit {code}: {stderr}");
    for key in [
        "daemon.listen",
        "upstreams.Bad",
        "upstreams.two",
        "upstreams.typo: unknown field `comand`",
    ] {
        ensure!(stderr.contains(key), "`{key}` not reported in:\n{stderr}");
    }
    let (code, _, stderr) = check_config(&dir.path().join("missing.toml"))?;
    ensure!(
        code == 64 && stderr.contains("cannot read"),
        "exit {code}: {stderr}"
    );
    Ok(())
}

#[test]
fn serve_refuses_a_bad_config_without_starting() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "[upstreams.x]\nurl = \"ftp://example.invalid/mcp\"\n",
    )?;
    let output = Command::new(plexus_binary())
        .args(["serve", "--config"])
        .arg(&path)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(output.status.code() == Some(64), "{stderr}");
    ensure!(stderr.contains("upstreams.x.url"), "{stderr}");
    Ok(())
}
