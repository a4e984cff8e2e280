//! The local three-node test cluster (`tests/broker/ctl cluster ...`), so
//! that `redeliver bench` on a checkout measures a cluster with no set-up.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::Context as _;

/// A local cluster the bench uses: its URL list, and whether the bench
/// started it (and so stops it again).
pub struct LocalCluster {
    pub urls: String,
    pub started_here: bool,
    ctl: PathBuf,
}

fn ctl_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/broker/ctl")
}

/// Starts the local cluster unless it runs already; `None` when this binary
/// has no checkout beside it (an installed binary), as for the local node.
pub async fn up(out: &mut dyn std::io::Write) -> anyhow::Result<Option<LocalCluster>> {
    let ctl = ctl_path();
    if !ctl.is_file() {
        return Ok(None);
    }
    // `status` prints one line a node; a cluster with any node running is
    // someone's, and is brought up but never stopped by us.
    let status = ctl_cmd(&ctl, "status").await?.1;
    let running = status.lines().any(|l| l.ends_with(" running"));
    if !running {
        writeln!(
            out,
            "starting the local three-node test cluster with tests/broker/ctl cluster up..."
        )?;
    }
    let (ok, stdout) = ctl_cmd(&ctl, "up").await?;
    anyhow::ensure!(
        ok,
        "{} cluster up failed; its messages are above",
        ctl.display()
    );
    let urls = stdout.lines().last().unwrap_or_default().trim().to_string();
    anyhow::ensure!(
        !urls.is_empty(),
        "{} cluster up printed no URL list",
        ctl.display()
    );
    Ok(Some(LocalCluster {
        urls,
        started_here: !running,
        ctl,
    }))
}

impl LocalCluster {
    /// Stops the cluster when [`up`] started it; leaves it running otherwise.
    pub async fn release(self) -> anyhow::Result<()> {
        if self.started_here {
            let (ok, _) = ctl_cmd(&self.ctl, "down").await?;
            anyhow::ensure!(ok, "{} cluster down failed", self.ctl.display());
        }
        Ok(())
    }
}

/// `ctl cluster VERB` as a child process (its stderr goes to ours):
/// whether it succeeded, and its stdout.
async fn ctl_cmd(ctl: &Path, verb: &str) -> anyhow::Result<(bool, String)> {
    let out = tokio::process::Command::new(ctl)
        .args(["cluster", verb])
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .await
        .with_context(|| format!("running {} cluster {verb}", ctl.display()))?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    ))
}
