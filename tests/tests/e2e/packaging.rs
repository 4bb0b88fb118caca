//! plexus installed as a service: the .deb `packaging/deb/build` makes, installed
//! with dpkg into a clean Debian root (files, modes, the `plexus` user, the
//! conffile, `check-config` run as that user, `systemd-analyze verify` on the
//! unit it installed, purge); and the container image definition, checked against
//! what plexus and the .deb provide (no container engine runs here).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use plexus_tests::{plexus_binary, Daemon};

/// Where the service's configuration lives, in the .deb and in the container.
const CONFIG: &str = "/etc/plexus/config.toml";
/// The state directory: the .deb's `plexus` user's home, the container's volume.
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

/// `cargo install --path daemon --locked` (the README's "From source"): the package
/// there is `plexus`, with the `plexus` binary needing no feature, its siblings
/// reached by path inside the repository, and the lock file current (`--locked`
/// refuses to update it). The install itself compiles for minutes; it is not run here.
#[test]
fn cargo_install_path_daemon_finds_the_plexus_binary() -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let metadata = run(Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--locked",
            "--offline",
        ])
        .current_dir(repository().join("daemon")))?;
    let metadata: serde_json::Value = serde_json::from_slice(&metadata.stdout)?;
    let manifest = std::fs::canonicalize(repository().join("daemon/Cargo.toml"))?;
    let package = metadata["packages"]
        .as_array()
        .context("no packages")?
        .iter()
        .find(|package| package["manifest_path"].as_str() == manifest.to_str())
        .context("no package at daemon/Cargo.toml")?;
    ensure!(package["name"] == "plexus", "{}", package["name"]);
    ensure!(package["rust_version"].is_string() && package["license"].is_string());
    let binary = package["targets"]
        .as_array()
        .context("no targets")?
        .iter()
        .find(|target| target["kind"] == serde_json::json!(["bin"]) && target["name"] == "plexus")
        .context("daemon/ has no `plexus` binary")?;
    ensure!(
        binary["required-features"].is_null(),
        "the binary needs features: {}",
        binary["required-features"]
    );
    let repository = std::fs::canonicalize(repository())?;
    for dependency in package["dependencies"]
        .as_array()
        .context("no dependencies")?
    {
        if let Some(path) = dependency["path"].as_str() {
            ensure!(
                Path::new(path).starts_with(&repository),
                "{} is outside the repository: {path}",
                dependency["name"]
            );
        }
    }
    Ok(())
}

/// One instruction of a Containerfile: its keyword and the rest of its line
/// (continuations joined), with the stage it belongs to.
struct Instruction {
    stage: usize,
    keyword: String,
    rest: String,
}

fn instructions(text: &str) -> Vec<Instruction> {
    let mut joined = Vec::new();
    let mut pending = String::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('#') || (line.is_empty() && pending.is_empty()) {
            continue;
        }
        match line.strip_suffix('\\') {
            Some(head) => {
                pending.push_str(head);
                pending.push(' ');
            }
            None => {
                pending.push_str(line);
                joined.push(std::mem::take(&mut pending));
            }
        }
    }
    let mut stage = 0;
    joined
        .into_iter()
        .filter(|line| !line.trim().is_empty())
        .map(|line| {
            let (keyword, rest) = line.split_once(' ').unwrap_or((&line, ""));
            let keyword = keyword.to_uppercase();
            if keyword == "FROM" {
                stage += 1;
            }
            Instruction {
                stage,
                keyword,
                rest: rest.trim().to_string(),
            }
        })
        .collect()
}

/// The exec form `["a", "b"]` at the end of `text`.
fn exec_form(text: &str) -> anyhow::Result<Vec<String>> {
    let start = text.find('[').context("not the exec form")?;
    Ok(serde_json::from_str(&text[start..])?)
}

/// No engine runs here (and the base images are not in any package registry):
/// every path, port, user and command the image definition names is checked
/// against plexus and the .deb's layout, and its health check is run for real
/// against a daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_containerfile_names_what_plexus_provides() -> anyhow::Result<()> {
    let dir = repository().join("packaging/container");
    let text = std::fs::read_to_string(dir.join("Containerfile"))?;
    let all = instructions(&text);
    let last_stage = all.iter().map(|i| i.stage).max().unwrap_or(0);
    ensure!(last_stage >= 2, "not a multi-stage build");
    let find = |stage: usize, keyword: &str| -> Vec<&Instruction> {
        all.iter()
            .filter(|i| i.stage == stage && i.keyword == keyword)
            .collect()
    };

    // The builder: a Rust at least the workspace's rust-version, building the
    // `plexus` package's binary from the lock file.
    let builder = &find(1, "FROM")[0].rest;
    let rust = builder
        .split_once("rust:")
        .and_then(|(_, tag)| tag.split('-').next())
        .with_context(|| format!("the build stage is not a rust image: {builder}"))?;
    let workspace = std::fs::read_to_string(repository().join("Cargo.toml"))?;
    let wanted = workspace
        .lines()
        .find_map(|line| line.strip_prefix("rust-version = "))
        .context("no rust-version")?
        .trim_matches('"');
    let numbers = |version: &str| -> Vec<u32> {
        version
            .split('.')
            .filter_map(|part| part.parse().ok())
            .collect()
    };
    ensure!(
        numbers(rust) >= numbers(wanted),
        "rust {rust} < rust-version {wanted}"
    );
    let build_stage = all
        .iter()
        .filter(|i| i.stage == 1 && i.keyword == "RUN")
        .map(|i| i.rest.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    for expected in [
        "cargo build --release --locked -p plexus --bin plexus",
        "target/release/plexus /out/usr/bin/plexus",
        "-o 65532 -g 65532 /out/var/lib/plexus",
    ] {
        ensure!(
            build_stage.contains(expected),
            "the build stage lacks `{expected}`"
        );
    }
    let package = std::fs::read_to_string(repository().join("daemon/Cargo.toml"))?;
    ensure!(package.contains("name = \"plexus\"") && repository().join("Cargo.lock").exists());
    let ignored = std::fs::read_to_string(repository().join(".dockerignore"))?;
    ensure!(ignored.lines().any(|line| line.trim() == "target/"));

    // The image: distroless, not root, the binary where the .deb puts it.
    let base = &find(last_stage, "FROM")[0].rest;
    ensure!(
        base.starts_with("gcr.io/distroless/"),
        "not distroless: {base}"
    );
    let user = &find(last_stage, "USER")
        .last()
        .context("no USER: the image would run as root")?
        .rest;
    let (uid, gid) = user.split_once(':').unwrap_or((user, user));
    ensure!(
        uid.parse::<u32>().is_ok_and(|uid| uid != 0) && gid.parse::<u32>().is_ok(),
        "USER {user}: not a numeric non-root user"
    );
    let copies: Vec<&str> = find(last_stage, "COPY")
        .iter()
        .map(|i| i.rest.as_str())
        .collect();
    ensure!(
        copies
            .iter()
            .any(|copy| copy.ends_with("/out/usr/bin/plexus /usr/bin/plexus")),
        "{copies:?}"
    );
    ensure!(
        copies
            .iter()
            .any(|copy| copy.contains(&format!("--chown={uid}:{gid}"))
                && copy.ends_with(&format!("/out{STATE_DIR} {STATE_DIR}"))),
        "the state directory is not the user's: {copies:?}"
    );
    let volume = exec_form(&find(last_stage, "VOLUME")[0].rest)?;
    ensure!(volume == [STATE_DIR], "VOLUME {volume:?}");

    // The config the image expects: valid, listening on the exposed port, its
    // state directory the volume, its admin listener where the health check asks.
    let example = tempfile::tempdir()?;
    let config = example.path().join("config.toml");
    std::fs::copy(dir.join("config.toml"), &config)?;
    std::fs::write(
        example.path().join("client.token"),
        "a-client-token-of-some-length",
    )?;
    let checked = run(Command::new(plexus_binary())
        .args(["check-config", "--config"])
        .arg(&config))?;
    ensure!(stdout(&checked).contains("valid"));
    let table: toml::Table = toml::from_str(&std::fs::read_to_string(&config)?)?;
    let daemon = table.get("daemon").context("no [daemon]")?;
    let key = |name: &str| daemon.get(name).and_then(|value| value.as_str());
    let exposed = &find(last_stage, "EXPOSE")[0].rest;
    ensure!(
        key("listen").is_some_and(|listen| listen.ends_with(&format!(":{exposed}"))),
        "listen {:?} is not on the exposed port {exposed}",
        key("listen")
    );
    ensure!(key("state_dir") == Some(STATE_DIR));
    ensure!(key("admin_listen").is_some_and(|admin| admin.starts_with("127.0.0.1:")));

    // The command: the binary serving the mounted config (a missing file is a bad
    // config, exit 64: the arguments themselves parse).
    let entrypoint = exec_form(&find(last_stage, "ENTRYPOINT")[0].rest)?;
    let command = exec_form(&find(last_stage, "CMD")[0].rest)?;
    ensure!(entrypoint == ["/usr/bin/plexus"], "{entrypoint:?}");
    ensure!(command == ["serve", "--config", CONFIG], "{command:?}");
    let missing = example.path().join("missing.toml");
    let served = Command::new(plexus_binary())
        .args(&command[..2])
        .arg(&missing)
        .output()?;
    ensure!(served.status.code() == Some(64), "{}", served.status);

    // The health check: the image's binary asking /healthz of the mounted config's
    // admin listener, run against a real daemon and against none.
    let health = exec_form(&find(last_stage, "HEALTHCHECK")[0].rest)?;
    ensure!(
        health == ["/usr/bin/plexus", "health", "--config", CONFIG],
        "{health:?}"
    );
    // As in the image, the config names the admin listener (here the daemon's).
    let daemon = Daemon::builder().start().await?;
    let mounted = example.path().join("mounted.toml");
    let admin = daemon.admin.trim_start_matches("http://");
    std::fs::write(&mounted, format!("[daemon]\nadmin_listen = \"{admin}\"\n"))?;
    let probe = || {
        tokio::process::Command::new(plexus_binary())
            .args(&health[1..3])
            .arg(&mounted)
            .output()
    };
    let answered = probe().await?;
    ensure!(answered.status.success(), "{}", answered.status);
    ensure!(daemon.stop().await?.success());
    let unanswered = probe().await?;
    if unanswered.status.success() {
        bail!("the health check passed with no daemon");
    }
    Ok(())
}
