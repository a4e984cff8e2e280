//! `redeliver bench`: throughput, latency, delay accuracy, memory and
//! scaling of the real worker (`redeliver run` processes), next to the
//! ceilings of the broker and of the HTTP path measured in the same run,
//! and of an ideal worker and retry loop (`ideal.rs`).
//!
//! Each phase works under a fresh prefix and deletes it afterwards. The
//! embedded sink (`sink.rs`) is the receiver; `load.rs` puts messages on the
//! broker; `procs.rs` runs and measures worker processes; `phases.rs` holds
//! the phases; `report.rs` prints the table and the JSON. `crash.rs`
//! counts the duplicates a worker kill or a broker restart causes;
//! `noisy.rs` and `flaky.rs` measure per-endpoint isolation; `state.rs`
//! what the shared endpoint state costs a delivery, `events.rs` what
//! operational events cost.

mod cluster;
mod console_pages;
mod crash;
mod e2e;
mod events;
mod flaky;
mod history_cost;
mod history_index;
mod horizontal;
mod ideal;
mod ideal_loop;
mod load;
mod noisy;
mod options;
mod pairs;
mod phases;
mod probe;
mod procs;
mod report;
mod sink;
mod state;
mod timed;
mod traced;
mod window;

pub use options::{BenchOptions, Phase};
pub use report::{Figure, Report};

/// Runs the selected phases and returns their figures. Progress goes to
/// `progress` (stderr for the CLI); the table is printed by the caller.
pub async fn run(
    opts: &BenchOptions,
    progress: &mut (dyn std::io::Write + Send),
) -> anyhow::Result<Report> {
    let mut phases = if opts.phases.is_empty() {
        Phase::ALL.to_vec()
    } else {
        opts.phases.clone()
    };
    phases.sort();
    phases.dedup();
    let mut bench = phases::Bench::new(opts).await?;
    for phase in phases {
        writeln!(progress, "bench: {} ...", phase.name())?;
        let started = std::time::Instant::now();
        bench.run_phase(phase).await?;
        writeln!(
            progress,
            "bench: {} done in {:.1} s",
            phase.name(),
            started.elapsed().as_secs_f64()
        )?;
    }
    Ok(bench.finish().await)
}
