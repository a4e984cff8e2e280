//! `status`: queue depths and consumers over AMQP (passive declares), the
//! delay mechanism's availability, and, when a management API is given,
//! the unacked count that AMQP cannot tell.

use lapin::options::{ExchangeDeleteOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use serde::Serialize;

use crate::config::{AmqpUrl, BrokerSettings};
use crate::topology::Topology;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct QueueStatus {
    pub name: String,
    /// `false` when the queue has not been declared yet.
    pub exists: bool,
    pub ready: u32,
    /// From the management API; `None` when it was not asked or not reachable.
    pub unacked: Option<u64>,
    pub consumers: u32,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Status {
    pub prefix: String,
    pub broker: String,
    pub work: QueueStatus,
    pub dead: QueueStatus,
    pub delay_backend: &'static str,
    /// Whether the broker has the `x-delayed-message` exchange type.
    pub retry_exchange_type_available: bool,
    /// Messages the plugin still holds for this prefix (`messages_delayed`
    /// of the retry exchange, from the management API); `None` when not
    /// asked, not reachable, or not reported.
    pub plugin_delayed: Option<u64>,
    /// The cascade's hold queue: short delays waiting for a worker
    /// (`ready`) or held by one (`unacked`, from the management API), and
    /// the workers holding (`consumers`).
    pub hold: QueueStatus,
    /// The cascade's queues that exist, with the messages waiting in each
    /// (whichever backend is selected, so a migration can be watched).
    pub cascade: Vec<CascadeQueueStatus>,
}

/// One queue of the cascade: stage `stage`, digit `digit`.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct CascadeQueueStatus {
    pub queue: String,
    pub stage: u32,
    pub digit: u32,
    /// How long each message waits in this queue: digit × 16^stage ms.
    pub ttl_ms: u64,
    pub messages: u32,
}

pub async fn status(
    broker: &BrokerSettings,
    management_url: Option<&str>,
) -> Result<Status, lapin::Error> {
    let t = Topology::new(&broker.prefix);
    let conn = broker.url.connect("redeliver status").await?;
    let mut probe = Probe::new(&conn);
    let mut work = probe.queue(&t.work).await?;
    let mut dead = probe.queue(&t.dead).await?;
    let mut hold = probe.queue(&crate::delay::cascade::hold(&t)).await?;
    let mut cascade = vec![];
    for (stage, digit, name) in crate::delay::cascade::queues(&t) {
        let q = probe.queue(&name).await?;
        if q.exists {
            cascade.push(CascadeQueueStatus {
                queue: name,
                stage,
                digit,
                ttl_ms: crate::delay::cascade::ttl_ms(stage, digit),
                messages: q.ready,
            });
        }
    }
    probe.close().await;
    let _ = conn.close(200, "status done".into()).await;
    let mut plugin_delayed = None;
    if let Some(m) = management_url {
        work.unacked = api_u64(m, &broker.url, "queues", &t.work, "messages_unacknowledged").await;
        dead.unacked = api_u64(m, &broker.url, "queues", &t.dead, "messages_unacknowledged").await;
        let h = &hold.name;
        hold.unacked = api_u64(m, &broker.url, "queues", h, "messages_unacknowledged").await;
        plugin_delayed = api_u64(m, &broker.url, "exchanges", &t.retry, "messages_delayed").await;
    }
    Ok(Status {
        prefix: broker.prefix.clone(),
        broker: broker.url.redacted(),
        work,
        dead,
        hold,
        delay_backend: broker.delay.as_str(),
        retry_exchange_type_available: delayed_type_available(&broker.url, &broker.prefix).await,
        plugin_delayed,
        cascade,
    })
}

/// One passive declare on a channel of its own (see [`Probe`]).
pub(crate) async fn queue(
    conn: &lapin::Connection,
    name: &str,
) -> Result<QueueStatus, lapin::Error> {
    let mut probe = Probe::new(conn);
    let q = probe.queue(name).await;
    probe.close().await;
    q
}

/// Passive declares that share one channel while the queues exist: a
/// missing queue closes the channel (a soft error), and only then is a new
/// one opened. `status` reads up to 123 queues, mostly existing ones.
struct Probe<'a> {
    conn: &'a lapin::Connection,
    channel: Option<lapin::Channel>,
}

impl<'a> Probe<'a> {
    fn new(conn: &'a lapin::Connection) -> Self {
        Probe {
            conn,
            channel: None,
        }
    }

    async fn queue(&mut self, name: &str) -> Result<QueueStatus, lapin::Error> {
        let ch = match self.channel.take() {
            Some(ch) => ch,
            None => self.conn.create_channel().await?,
        };
        let passive = QueueDeclareOptions {
            passive: true,
            ..Default::default()
        };
        let declared = ch
            .queue_declare(name.into(), passive, FieldTable::default())
            .await;
        let (exists, ready, consumers) = match declared {
            Ok(q) => {
                self.channel = Some(ch);
                (true, q.message_count(), q.consumer_count())
            }
            Err(e) if e.is_amqp_soft_error() => (false, 0, 0),
            Err(e) => return Err(e),
        };
        Ok(QueueStatus {
            name: name.into(),
            exists,
            ready,
            unacked: None,
            consumers,
        })
    }

    async fn close(mut self) {
        if let Some(ch) = self.channel.take() {
            let _ = ch.close(200, "".into()).await;
        }
    }
}

/// Declares and deletes a throw-away `x-delayed-message` exchange, on a
/// connection of its own: an unknown type is a connection-level error.
pub async fn delayed_type_available(url: &AmqpUrl, prefix: &str) -> bool {
    let Ok(conn) = url.connect("redeliver status probe").await else {
        return false;
    };
    let name = format!(
        "{prefix}.probe.{}",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let ok = match conn.create_channel().await {
        Ok(ch) => {
            let mut args = FieldTable::default();
            args.insert(
                "x-delayed-type".into(),
                lapin::types::AMQPValue::LongString("direct".into()),
            );
            let kind = lapin::ExchangeKind::Custom("x-delayed-message".into());
            let declared = ch
                .exchange_declare(name.as_str().into(), kind, Default::default(), args)
                .await
                .is_ok();
            if declared {
                let _ = ch
                    .exchange_delete(name.as_str().into(), ExchangeDeleteOptions::default())
                    .await;
            }
            declared
        }
        Err(_) => false,
    };
    let _ = conn.close(200, "probe done".into()).await;
    ok
}

/// A number from the management API's view of a queue or exchange
/// (`kind`), or `None`. The API samples every `collect_statistics_interval`
/// (5 s by default), so the figure can lag by that much.
async fn api_u64(
    management_url: &str,
    amqp: &AmqpUrl,
    kind: &str,
    name: &str,
    field: &str,
) -> Option<u64> {
    let u = url::Url::parse(amqp.expose()).ok()?;
    // The AMQP path is the percent-encoded vhost, as the API wants it.
    let vhost = match u.path().trim_start_matches('/') {
        "" => "%2F".to_string(),
        v => v.to_string(),
    };
    let user = if u.username().is_empty() {
        "guest"
    } else {
        u.username()
    };
    let pass = u.password().unwrap_or("guest");
    let user = percent_decode(user);
    let pass = percent_decode(pass);
    let endpoint = format!(
        "{}/api/{kind}/{vhost}/{}",
        management_url.trim_end_matches('/'),
        url::form_urlencoded::byte_serialize(name.as_bytes()).collect::<String>()
    );
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .build()
        .ok()?;
    let resp = client
        .get(endpoint)
        .basic_auth(user, Some(pass))
        .send()
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_slice(&resp.bytes().await.ok()?).ok()?;
    v.get(field)?.as_u64()
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}
