//! The few things `status` reads from RabbitMQ's management HTTP API that
//! AMQP cannot tell: unacked counts, the plugin's held messages, which
//! node a connection is on, the cluster's nodes, and where each quorum
//! queue's leader and members are. Every call is best effort: `None` when
//! the API is not reachable or does not report the field.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use crate::config::AmqpUrl;

/// Where a queue lives on the cluster.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct Placement {
    /// `quorum`, `classic` or `stream`.
    pub kind: String,
    /// The node serving it: a quorum queue's leader, a classic queue's node.
    pub leader: Option<String>,
    /// A replicated queue's members, and those of them that are running.
    pub members: Vec<String>,
    pub online: Vec<String>,
}

/// A node of the cluster, as the API sees it.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct NodeStatus {
    pub name: String,
    pub running: bool,
}

/// The API at `base`, with the credentials and vhost of the first AMQP URL.
pub struct Api {
    base: String,
    vhost: String,
    user: String,
    pass: String,
    client: reqwest::Client,
}

impl Api {
    pub fn new(base: &str, amqp: &AmqpUrl) -> Option<Api> {
        let u = url::Url::parse(amqp.urls().first()?).ok()?;
        // The AMQP path is the percent-encoded vhost, as the API wants it.
        let vhost = match u.path().trim_start_matches('/') {
            "" => "%2F".to_string(),
            v => v.to_string(),
        };
        let user = match u.username() {
            "" => "guest",
            user => user,
        };
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(5))
            .build()
            .ok()?;
        Some(Api {
            base: base.trim_end_matches('/').to_string(),
            vhost,
            user: percent_decode(user),
            pass: percent_decode(u.password().unwrap_or("guest")),
            client,
        })
    }

    async fn get(&self, path: &str) -> Option<Value> {
        let resp = self
            .client
            .get(format!("{}/api/{path}", self.base))
            .basic_auth(&self.user, Some(&self.pass))
            .send()
            .await
            .ok()?;
        serde_json::from_slice(&resp.bytes().await.ok()?).ok()
    }

    /// A number of a queue's or exchange's (`kind`) view. The API samples
    /// every `collect_statistics_interval` (5 s by default), so it can lag.
    pub async fn u64(&self, kind: &str, name: &str, field: &str) -> Option<u64> {
        let path = format!("{kind}/{}/{}", self.vhost, encode(name));
        self.get(&path).await?.get(field)?.as_u64()
    }

    /// How many bindings have exchange `name` as their source.
    pub async fn bindings_from(&self, name: &str) -> Option<u64> {
        let path = format!("exchanges/{}/{}/bindings/source", self.vhost, encode(name));
        Some(self.get(&path).await?.as_array()?.len() as u64)
    }

    /// The node that serves AMQP at `url` (the one a connection to it is
    /// on), from the cluster's listeners (see [`node_listening`]).
    pub async fn node_at(&self, url: &str) -> Option<String> {
        let u = url::Url::parse(url).ok()?;
        let host = u.host_str()?.trim_matches(|c| c == '[' || c == ']');
        // The url crate knows no default port for amqp(s).
        let port = u.port().unwrap_or(match u.scheme() {
            "amqps" => 5671,
            _ => 5672,
        });
        let all = self.get("overview?columns=listeners").await?;
        node_listening(all.get("listeners")?.as_array()?, host, port)
    }

    /// How many `run` workers of `prefix` each node serves: their
    /// connections, named `redeliver run <prefix>`, by node.
    pub async fn workers_by_node(&self, prefix: &str) -> BTreeMap<String, u32> {
        let name = format!("redeliver run {prefix}");
        let mut by = BTreeMap::new();
        let all = self.get("connections?columns=node,client_properties").await;
        for c in all.as_ref().and_then(Value::as_array).into_iter().flatten() {
            let named = c.pointer("/client_properties/connection_name");
            if named.and_then(Value::as_str) == Some(name.as_str()) {
                let node = c.get("node").and_then(Value::as_str).unwrap_or("?");
                *by.entry(node.to_string()).or_insert(0) += 1;
            }
        }
        by
    }

    /// The cluster's nodes (disc and RAM), running or not.
    pub async fn nodes(&self) -> Option<Vec<NodeStatus>> {
        let all = self.get("nodes?columns=name,running").await?;
        let nodes = all.as_array()?.iter().filter_map(|n| {
            Some(NodeStatus {
                name: n.get("name")?.as_str()?.to_string(),
                running: n.get("running").and_then(Value::as_bool).unwrap_or(false),
            })
        });
        Some(nodes.collect())
    }

    /// Where each queue of the vhost whose name starts with `prefix` lives.
    pub async fn placements(&self, prefix: &str) -> HashMap<String, Placement> {
        let path = format!(
            "queues/{}?columns=name,type,node,leader,members,online",
            self.vhost
        );
        let Some(all) = self.get(&path).await else {
            return HashMap::new();
        };
        let queues = all.as_array().map(Vec::as_slice).unwrap_or_default();
        queues
            .iter()
            .filter_map(|q| {
                let name = q.get("name")?.as_str()?;
                name.starts_with(prefix)
                    .then(|| (name.to_string(), placement(q)))
            })
            .collect()
    }
}

/// Of the AMQP listeners on `port`: the node of the one bound to `host`,
/// else the one node named after `host` (`rabbit@host`, or its first
/// label), as when every node listens on all addresses. `None` when none,
/// or more than one, fits.
fn node_listening(listeners: &[Value], host: &str, port: u16) -> Option<String> {
    let on_port: Vec<(&str, &str)> = listeners
        .iter()
        .filter(|l| {
            let amqp = l.get("protocol").and_then(Value::as_str);
            amqp.is_some_and(|p| p.starts_with("amqp"))
                && l.get("port").and_then(Value::as_u64) == Some(u64::from(port))
        })
        .filter_map(|l| Some((l.get("node")?.as_str()?, l.get("ip_address")?.as_str()?)))
        .collect();
    let named = |node: &str| {
        let node_host = node.split('@').nth(1).unwrap_or_default();
        node_host == host || host.split('.').next() == Some(node_host)
    };
    let only = |nodes: Vec<&str>| (nodes.len() == 1).then(|| nodes[0].to_string());
    let bound: Vec<&str> = on_port
        .iter()
        .filter(|(_, ip)| *ip == host)
        .map(|(n, _)| *n)
        .collect();
    only(bound).or_else(|| {
        only(
            on_port
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| named(n))
                .collect(),
        )
    })
}

fn placement(q: &Value) -> Placement {
    let text = |k: &str| q.get(k).and_then(Value::as_str).map(str::to_string);
    let list = |k: &str| -> Vec<String> {
        let items = q.get(k).and_then(Value::as_array);
        let names = items.into_iter().flatten().filter_map(Value::as_str);
        names.map(str::to_string).collect()
    };
    Placement {
        kind: text("type").unwrap_or_else(|| "classic".into()),
        leader: text("leader").or_else(|| text("node")),
        members: list("members"),
        online: list("online"),
    }
}

fn encode(name: &str) -> String {
    url::form_urlencoded::byte_serialize(name.as_bytes()).collect()
}

fn percent_decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quorum_queue_names_its_leader_and_members_a_classic_its_node() {
        let q = serde_json::json!({"name": "p.work", "type": "quorum", "leader": "a@h",
            "members": ["a@h", "b@h", "c@h"], "online": ["a@h", "b@h"], "node": "a@h"});
        let p = placement(&q);
        assert_eq!(p.leader.as_deref(), Some("a@h"));
        assert_eq!((p.members.len(), p.online.len()), (3, 2));
        let c = placement(&serde_json::json!({"name": "p.dead", "type": "classic", "node": "b@h"}));
        assert_eq!(
            (c.kind.as_str(), c.leader.as_deref()),
            ("classic", Some("b@h"))
        );
        assert!(c.members.is_empty());
    }

    #[test]
    fn the_node_is_found_by_its_listener_or_its_host_name() {
        let l = |node: &str, ip: &str, port: u16| serde_json::json!({"node": node, "protocol": "amqp", "ip_address": ip, "port": port});
        let local = [
            l("n1@localhost", "127.0.0.1", 5684),
            l("n2@localhost", "127.0.0.1", 5685),
        ];
        assert_eq!(
            node_listening(&local, "127.0.0.1", 5685).as_deref(),
            Some("n2@localhost")
        );
        let hosts = [l("rabbit@mq1", "::", 5672), l("rabbit@mq2", "::", 5672)];
        assert_eq!(
            node_listening(&hosts, "mq2.example.com", 5672).as_deref(),
            Some("rabbit@mq2")
        );
        assert_eq!(node_listening(&hosts, "10.0.0.7", 5672), None, "ambiguous");
        assert_eq!(node_listening(&local, "127.0.0.1", 5672), None);
    }

    #[test]
    fn credentials_and_vhost_come_from_the_first_url() {
        let a = Api::new(
            "http://m:15672/",
            &AmqpUrl::new("amqp://u%40x:p%2Fw@h1:5672/v%2F1,amqp://o:o@h2/"),
        )
        .unwrap();
        assert_eq!((a.user.as_str(), a.pass.as_str()), ("u@x", "p/w"));
        assert_eq!(
            (a.vhost.as_str(), a.base.as_str()),
            ("v%2F1", "http://m:15672")
        );
    }
}
