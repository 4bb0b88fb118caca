//! plexus installed as a service: the .deb `packaging/deb/build` makes, installed
//! with dpkg into a clean Debian root (files, modes, the `plexus` user, the
//! conffile, `check-config` run as that user, `systemd-analyze verify` on the
//! unit it installed, purge).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{ensure, Context};
use plexus_tests::plexus_binary;

/// Where the service's configuration lives.
const CONFIG: &str = "/etc/plexus/config.toml";
/// The state directory: the `plexus` user's home.
const STATE_DIR: &str = "/var/lib/plexus";

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Runs `command`; its output, or an error with its stderr when it failed.
fn run(command: &mut Command) -> anyhow::Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    ensure!(
        output.status.success(),
        "{command:?}: {}\n{}{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The clean root `scripts/ensure-deb-root` made for this machine's release.
fn clean_root_tarball() -> anyhow::Result<PathBuf> {
    let release = std::fs::read_to_string("/etc/os-release")?
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|name| name.trim_matches('"').to_string())
        .context("/etc/os-release names no VERSION_CODENAME")?;
    Ok(repository().join(format!("target/deb-root/{release}-minbase.tar")))
}

/// A file's mode bits, owner and group.
fn owned(path: &Path) -> anyhow::Result<(u32, u32, u32)> {
    let metadata =
        std::fs::symlink_metadata(path).with_context(|| format!("{} missing", path.display()))?;
    Ok((metadata.mode() & 0o7777, metadata.uid(), metadata.gid()))
}

/// The fields of `name`'s line in a passwd or group file.
fn account(file: &Path, name: &str) -> anyhow::Result<Vec<String>> {
    std::fs::read_to_string(file)?
        .lines()
        .map(|line| line.split(':').map(str::to_string).collect::<Vec<_>>())
        .find(|fields| fields.first().map(String::as_str) == Some(name))
        .with_context(|| format!("no `{name}` in {}", file.display()))
}

#[test]
fn the_deb_installs_into_a_clean_root_as_a_service() -> anyhow::Result<()> {
    let started = Instant::now();
    let root_user = Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|output| stdout(&output).trim() == "0");
    if !Path::new("/usr/bin/dpkg").exists() || !root_user {
        // chroot and dpkg into a root need both; scripts/test runs as root on Debian.
        println!("skipped: needs root on a Debian machine");
        return Ok(());
    }
    let tarball = clean_root_tarball()?;
    ensure!(
        tarball.exists(),
        "{} missing: run scripts/ensure-deb-root (scripts/test does)",
        tarball.display()
    );
    let work = tempfile::tempdir()?;

    // The test command's own build of the package, over the debug binary, which
    // is why it is not compressed (62 MB).
    let binary = std::fs::canonicalize(plexus_binary())?;
    let built = run(Command::new(repository().join("packaging/deb/build"))
        .arg("--binary")
        .arg(&binary)
        .arg("--out")
        .arg(work.path())
        .args(["--compression", "none"]))?;
    let deb = PathBuf::from(stdout(&built).trim());
    let build_time = started.elapsed();

    let root = work.path().join("root");
    std::fs::create_dir(&root)?;
    run(Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-xf")
        .arg(&tarball))?;
    let unpack_time = started.elapsed() - build_time;
    ensure!(
        !root.join("usr/bin/plexus").exists() && !root.join("etc/plexus").exists(),
        "the root is not clean"
    );
    std::fs::copy(&deb, root.join("tmp/plexus.deb"))?;
    let chroot = |args: &[&str]| {
        let mut command = Command::new("chroot");
        command.arg(&root).args(args);
        command
    };
    run(chroot(&["dpkg", "-i", "/tmp/plexus.deb"]).stdin(std::process::Stdio::null()))?;
    let install_time = started.elapsed() - build_time - unpack_time;

    // The system user and group, with the state directory as home and no login.
    let user = account(&root.join("etc/passwd"), "plexus")?;
    let group = account(&root.join("etc/group"), "plexus")?;
    let uid: u32 = user[2].parse()?;
    let gid: u32 = group[2].parse()?;
    ensure!(uid < 1000 && uid > 0, "not a system uid: {user:?}");
    ensure!(user[3] == gid.to_string(), "primary group: {user:?}");
    ensure!(
        user[5] == STATE_DIR && user[6] == "/usr/sbin/nologin",
        "{user:?}"
    );

    // Files, modes and owners.
    let manual = "usr/share/man/man1";
    for (path, expected) in [
        ("usr/bin/plexus", (0o755, 0, 0)),
        ("usr/lib/systemd/system/plexus.service", (0o644, 0, 0)),
        ("etc/plexus/config.toml", (0o640, 0, gid)),
        ("var/lib/plexus", (0o750, uid, gid)),
        ("var/cache/plexus", (0o750, uid, gid)),
        (
            "usr/share/bash-completion/completions/plexus",
            (0o644, 0, 0),
        ),
        ("usr/share/zsh/vendor-completions/_plexus", (0o644, 0, 0)),
        (
            "usr/share/fish/vendor_completions.d/plexus.fish",
            (0o644, 0, 0),
        ),
        ("usr/share/man/man1/plexus.1.gz", (0o644, 0, 0)),
        ("usr/share/man/man1/plexus-serve.1.gz", (0o644, 0, 0)),
        ("usr/share/man/man1/plexus-check-config.1.gz", (0o644, 0, 0)),
    ] {
        let found = owned(&root.join(path))?;
        ensure!(
            found == expected,
            "/{path}: mode {:o} owner {}:{}, expected mode {:o} owner {}:{}",
            found.0,
            found.1,
            found.2,
            expected.0,
            expected.1,
            expected.2
        );
    }
    // The completions and pages are the binary's own (generated, not stale).
    let bash = std::fs::read_to_string(root.join("usr/share/bash-completion/completions/plexus"))?;
    ensure!(bash.contains("_plexus()") && bash.contains("check-config"));
    let page = run(Command::new("gzip")
        .arg("-dc")
        .arg(root.join(manual).join("plexus-check-config.1.gz")))?;
    ensure!(
        stdout(&page).contains(".TH plexus-check-config 1"),
        "{}",
        stdout(&page)
    );
    ensure!(
        !root.join(manual).join("plexus-keeper.1.gz").exists(),
        "a page for an internal command"
    );

    // The unit: the shipped hardening, the package's binary and user.
    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/plexus.service"))?;
    let lines: Vec<&str> = unit.lines().map(str::trim).collect();
    for expected in [
        "ExecStart=/usr/bin/plexus serve --config /etc/plexus/config.toml",
        "User=plexus",
        "Group=plexus",
        "StateDirectory=plexus",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=read-only",
        "PrivateTmp=yes",
        "ProtectKernelTunables=yes",
        "ProtectControlGroups=yes",
        "RestrictSUIDSGID=yes",
        "LockPersonality=yes",
        "UMask=0077",
        "KillMode=control-group",
    ] {
        ensure!(lines.contains(&expected), "`{expected}` missing:\n{unit}");
    }
    ensure!(!lines.iter().any(|line| line.starts_with("DynamicUser=")));

    // dpkg knows the config as a conffile ...
    let conffiles = run(&mut chroot(&[
        "dpkg-query",
        "-W",
        "-f=${Conffiles}",
        "plexus",
    ]))?;
    ensure!(
        stdout(&conffiles).contains(&format!(" {CONFIG} ")),
        "not a conffile: {}",
        stdout(&conffiles)
    );
    // ... which the `plexus` user can read and finds valid, with its state dir.
    let checked = run(Command::new("chroot")
        .arg("--userspec=plexus:plexus")
        .arg(&root)
        .args(["/usr/bin/plexus", "check-config", "--config", CONFIG]))?;
    ensure!(stdout(&checked).contains("valid"), "{}", stdout(&checked));
    let config = std::fs::read_to_string(root.join("etc/plexus/config.toml"))?;
    ensure!(config.contains(&format!("state_dir = \"{STATE_DIR}\"")));
    let version = run(&mut chroot(&["/usr/bin/plexus", "--version"]))?;
    ensure!(
        stdout(&version).starts_with(&format!("plexus {} (", env!("CARGO_PKG_VERSION"))),
        "{}",
        stdout(&version)
    );

    verify_installed_unit(&root)?;

    // An edit survives reinstalling (a conffile), and purge takes config and state.
    let edited = format!("{config}\n# edited by the administrator\n");
    std::fs::write(root.join("etc/plexus/config.toml"), &edited)?;
    run(chroot(&["dpkg", "-i", "/tmp/plexus.deb"]).stdin(std::process::Stdio::null()))?;
    ensure!(
        std::fs::read_to_string(root.join("etc/plexus/config.toml"))? == edited,
        "reinstalling replaced the edited config"
    );
    run(&mut chroot(&["dpkg", "--purge", "plexus"]))?;
    for gone in ["usr/bin/plexus", "etc/plexus/config.toml", "var/lib/plexus"] {
        ensure!(!root.join(gone).exists(), "/{gone} left after purge");
    }

    println!(
        "deb: built in {:.2?}, clean root unpacked in {:.2?}, installed in {:.2?}; whole test {:.2?}",
        build_time,
        unpack_time,
        install_time,
        started.elapsed()
    );
    Ok(())
}

/// `systemd-analyze verify` on the unit as installed, run by the machine's systemd:
/// the root has none. Its ExecStart names the root's copy of the binary, since
/// `verify` refuses a command that does not exist.
fn verify_installed_unit(root: &Path) -> anyhow::Result<()> {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .map_or(true, |output| !output.status.success())
    {
        // The test command installs it; a developer's machine may lack it.
        println!("skipped systemd-analyze verify: not installed");
        return Ok(());
    }
    let unit = std::fs::read_to_string(root.join("usr/lib/systemd/system/plexus.service"))?;
    let dir = tempfile::tempdir()?;
    let copy = dir.path().join("plexus.service");
    std::fs::write(
        &copy,
        unit.replace(
            "ExecStart=/usr/bin/plexus ",
            &format!("ExecStart={}/usr/bin/plexus ", root.display()),
        ),
    )?;
    let output = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&copy)
        .output()?;
    let stderr = String::from_utf8_lossy(&output.stderr);
    ensure!(
        output.status.success(),
        "systemd-analyze verify: {}:\n{stderr}",
        output.status
    );
    // Unknown keys are only warnings; lines about other units are not ours.
    let ours: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains("plexus.service") || line.contains("Unknown"))
        .collect();
    ensure!(ours.is_empty(), "verify warned:\n{}", ours.join("\n"));
    Ok(())
}
