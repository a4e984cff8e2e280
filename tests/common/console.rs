//! A history console in-process on 127.0.0.1:0 with a data directory of
//! its own (deleted on drop), and its API asked over real HTTP.

use std::path::PathBuf;
use std::time::Duration;

use redeliver::config::BrokerSettings;
use redeliver::console::{Console, ConsoleSettings};
use redeliver::history::HistorySettings;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::harness::wait_until_async;

pub struct TestConsole {
    pub url: String,
    pub token: String,
    /// The read-only token, for consoles started with one.
    pub read_token: Option<String>,
    pub data: PathBuf,
    stop: CancellationToken,
    join: Option<tokio::task::JoinHandle<()>>,
}

impl TestConsole {
    /// Starts a console for `broker`'s prefix on a fresh data directory.
    pub async fn start(broker: &BrokerSettings) -> TestConsole {
        Self::start_with(broker, false).await
    }

    /// Starts a console, with a read-only token too when `viewers`.
    pub async fn start_with(broker: &BrokerSettings, viewers: bool) -> TestConsole {
        let data = std::env::temp_dir().join(format!(
            "redeliver-console-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let token = format!("tok-{}", uuid::Uuid::new_v4().simple());
        let read_token = viewers.then(|| format!("read-{}", uuid::Uuid::new_v4().simple()));
        let s = ConsoleSettings {
            listen: "127.0.0.1:0".parse().unwrap(),
            data: data.clone(),
            token: Some(token.clone().into()),
            read_token: read_token.clone().map(Into::into),
            history: HistorySettings::default(),
        };
        let console = Console::bind(s).await.expect("console binds");
        let url = format!("http://{}", console.local_addr());
        let (stop, broker) = (CancellationToken::new(), broker.clone());
        let token2 = stop.clone();
        let join = tokio::spawn(async move {
            if let Err(e) = console.serve(&broker, token2).await {
                eprintln!("console stopped: {e}");
            }
        });
        TestConsole {
            url,
            token,
            read_token,
            data,
            stop,
            join: Some(join),
        }
    }

    /// Waits for `/readyz` to answer 200.
    pub async fn ready(&self, within: Duration) -> bool {
        let url = format!("{}/readyz", self.url);
        wait_until_async(
            within,
            async || matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200),
        )
        .await
    }

    /// `GET path` with the token; the status and the JSON body.
    pub async fn get(&self, path: &str) -> (u16, Value) {
        let r = reqwest::Client::new()
            .get(format!("{}{path}", self.url))
            .bearer_auth(&self.token)
            .send()
            .await
            .expect("the console answers");
        let status = r.status().as_u16();
        let text = r.text().await.unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// One notification's attempts, oldest first.
    pub async fn attempts_of(&self, id: &str) -> Vec<Value> {
        let (status, v) = self.get(&format!("/api/notifications/{id}/attempts")).await;
        assert_eq!(status, 200, "{v}");
        v.as_array().cloned().unwrap_or_default()
    }

    /// Waits until `/api/attempts?limit=10000` holds `n` records; them.
    pub async fn wait_records(&self, n: usize, within: Duration) -> Vec<Value> {
        let mut last = vec![];
        wait_until_async(within, async || {
            let (_, v) = self.get("/api/attempts?limit=10000").await;
            last = v.as_array().cloned().unwrap_or_default();
            last.len() >= n
        })
        .await;
        last
    }

    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(j) = self.join.take() {
            let _ = tokio::time::timeout(Duration::from_secs(5), j).await;
        }
    }
}

impl Drop for TestConsole {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}
