//! The one place that turns the command line into settings: the broker's,
//! a worker's and the retry policy. `run`, `config check` and `config show`
//! all go through it, so they agree on what a flag means.

use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::cli::args::EndpointArgs;
use crate::cli::args::{GlobalArgs, PolicyArgs, RunArgs};
use crate::config::{
    AmqpUrl, BrokerSettings, DelayBackend, EndpointSettings, ProbeSettings, WorkerSettings,
    DEFAULT_AMQP_URL,
};
use crate::policy::{self, Backoff, BreakerPolicy, RetryPolicy, SuccessRules};

/// The broker, prefix, queue type and delay backend every command uses.
pub fn broker_settings(g: &GlobalArgs) -> BrokerSettings {
    BrokerSettings {
        url: AmqpUrl::new(g.amqp_url.as_deref().unwrap_or(DEFAULT_AMQP_URL)),
        prefix: g.prefix.clone(),
        queue_type: g.queue_type,
        delay: g.delay_backend,
    }
}

/// `backend` picks the default `--retry-settle`: only the plugin confirms
/// before its disk write.
pub fn worker_settings(args: &RunArgs, backend: DelayBackend) -> anyhow::Result<WorkerSettings> {
    let policy = retry_policy(&args.policy)?;
    let concurrency = usize::from(args.concurrency);
    let prefetch = args.prefetch.map(usize::from);
    if let Some(p) = prefetch.filter(|&p| p < concurrency) {
        bail!(
            "--prefetch {p} is below --concurrency {concurrency}: some slots could never be used"
        );
    }
    let every = args.delay_probe_every;
    if !every.is_zero() && every < Duration::from_millis(100) {
        bail!("--delay-probe-every must be 0s (off) or at least 100ms");
    }
    Ok(WorkerSettings {
        delay_probe: ProbeSettings {
            every: Some(every).filter(|d| !d.is_zero()),
            grace: args.delay_probe_grace,
            failover: args.delay_failover,
        },
        concurrency,
        prefetch,
        hold_prefetch: args.hold_prefetch,
        lanes: args.lanes,
        policy,
        rules: SuccessRules {
            permanent_status: args.permanent_status.clone(),
            success_body: args.success_body.clone(),
        },
        max_message_bytes: args.max_message_bytes,
        confirm_timeout: args.confirm_timeout,
        shutdown_grace: args.shutdown_grace,
        retry_settle: args.retry_settle.unwrap_or(match backend {
            DelayBackend::Plugin => crate::config::DEFAULT_RETRY_SETTLE,
            DelayBackend::Cascade => Duration::ZERO,
        }),
        endpoints: endpoint_settings(&args.endpoint)?,
        max_age: Some(args.endpoint.max_age).filter(|d| !d.is_zero()),
        control: crate::config::ControlSettings {
            disable_after: args.endpoint.disable_after.0,
            breaker_park_after: args.endpoint.breaker_park_after.0.filter(|d| !d.is_zero()),
        },
        ops_events: crate::config::EventSettings {
            url: args.events.events_url.clone(),
            types: args.events.events_types.clone(),
            failing_after: args.events.failing_after,
        },
        history: args.history.settings(),
        ..WorkerSettings::default()
    })
}

/// Per-endpoint limits and the breaker, from `--endpoint-*`, `--breaker-*`,
/// `--max-endpoints`, `--max-parked` and `--max-waiting`.
fn endpoint_settings(a: &EndpointArgs) -> anyhow::Result<EndpointSettings> {
    if a.breaker_max_open < a.breaker_open {
        bail!(
            "--breaker-max-open {} is below --breaker-open {}",
            humantime::format_duration(a.breaker_max_open),
            humantime::format_duration(a.breaker_open)
        );
    }
    if a.breaker_open.is_zero() {
        bail!("--breaker-open must be more than 0s");
    }
    // Deferrals to a half-open time go through the delay backend.
    if a.breaker_max_open > policy::MAX_DELAY {
        bail!("--breaker-max-open is beyond the delayed exchange's limit (49 days)");
    }
    Ok(EndpointSettings {
        concurrency: a.endpoint_concurrency.map(usize::from),
        isolation: a.isolation,
        rate: a.endpoint_rate,
        breaker: BreakerPolicy {
            failures: a.breaker_failures,
            open: a.breaker_open,
            max_open: a.breaker_max_open,
            ..BreakerPolicy::default()
        },
        max_endpoints: a.max_endpoints,
        max_parked: a.max_parked,
        max_waiting: a.max_waiting,
    })
}

/// Builds and validates the policy; a delay beyond the exchange's limit is
/// rejected here, at start, not at the first retry.
pub fn retry_policy(p: &PolicyArgs) -> anyhow::Result<RetryPolicy> {
    let backoff = match &p.schedule {
        Some(s) => Backoff::Schedule(policy::parse_schedule(s).context("--schedule")?),
        None => Backoff::Exponential {
            initial: p.initial_delay,
            factor: p.factor,
            max: p.max_delay,
            jitter: p.jitter,
        },
    };
    let policy = RetryPolicy {
        max_attempts: p.max_attempts,
        backoff,
    };
    policy.validate().context("invalid retry policy")?;
    Ok(policy)
}
