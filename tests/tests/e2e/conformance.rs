//! The official MCP conformance suite through plexus: `scripts/conformance` runs the
//! server scenarios of two pinned releases (0.1.16; 0.2.0-alpha.12 with `--suite all`
//! and `--requirements 2026-07-28`) against servers directly and through plexus, and
//! fails if plexus loses one a server passes (the dual-era run once more through
//! HAProxy round robin in front of three nodes of one `[cluster]`); then the client scenarios (OAuth's
//! aside) with plexus as the client, and fails if plexus loses one the official
//! Python SDK's client passes on its own.
//!
//! The script prints its scenario | fixture | plexus table on the inherited
//! stdout, which the test harness does not capture, so the comparison shows in
//! every run of the test command, not only on failure.

use std::process::Command;

use anyhow::{ensure, Context};
use plexus_tests::{fixture_binary, plexus_binary};

#[test]
fn plexus_passes_every_conformance_scenario_the_fixture_passes() -> anyhow::Result<()> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/conformance");
    let status = Command::new(&script)
        // The binaries this test run was built with, wherever the target
        // directory is.
        .env("PLEXUS_BIN", plexus_binary())
        .env("PLEXUS_FIXTURE_BIN", fixture_binary())
        .status()
        .with_context(|| format!("running {}", script.display()))?;
    ensure!(
        status.success(),
        "scripts/conformance failed ({status}); its table above names each lost scenario and why"
    );
    Ok(())
}
