//! A real Chromium, headless, driven over WebDriver (Debian's `chromium`
//! and `chromium-driver`, through fantoccini): chromedriver on a free
//! port of its own, killed on drop. Every page can be photographed under
//! `target/console-screenshots/` and its console log read for errors.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::error::{CmdError, ErrorStatus};
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{json, Value};

pub struct Browser {
    pub c: Client,
    driver: Child,
    port: u16,
    pub base: String,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Browser {
    /// Starts chromedriver and a headless Chromium session on `base`.
    pub async fn start(base: &str) -> Browser {
        // Two crypto providers are linked in; the session is plain http.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let port = free_port();
        let driver = Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver runs (apt-get install chromium chromium-driver)");
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": "/usr/bin/chromium",
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                         "--disable-dev-shm-usage", "--window-size=1400,1000"],
            },
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let caps = caps.as_object().unwrap().clone();
        let url = format!("http://127.0.0.1:{port}");
        let mut last = None;
        for _ in 0..100 {
            match ClientBuilder::rustls()
                .expect("rustls")
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => {
                    return Browser {
                        c,
                        driver,
                        port,
                        base: base.to_string(),
                    }
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no WebDriver session: {last:?}");
    }

    pub async fn goto(&self, path: &str) {
        self.c.goto(&format!("{}{path}", self.base)).await.unwrap();
    }

    pub async fn path(&self) -> String {
        let u = self.c.current_url().await.unwrap();
        match u.query() {
            Some(q) => format!("{}?{q}", u.path()),
            None => u.path().to_string(),
        }
    }

    /// Waits (up to 10 s) for a navigation to reach `want`; the path then.
    pub async fn wait_path(&self, want: &str) -> String {
        let end = std::time::Instant::now() + Duration::from_secs(10);
        loop {
            let now = self.path().await;
            if now == want || std::time::Instant::now() > end {
                return now;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub async fn text(&self, css: &str) -> String {
        self.c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"))
            .text()
            .await
            .unwrap()
    }

    pub async fn texts(&self, css: &str) -> Vec<String> {
        let mut out = vec![];
        for e in self.c.find_all(Locator::Css(css)).await.unwrap() {
            out.push(e.text().await.unwrap());
        }
        out
    }

    /// Clicks the element `css` finds. A page that re-renders between the
    /// find and the click (the endpoints page refreshes itself) leaves a
    /// stale element: it is found again, a few times at most.
    pub async fn click(&self, css: &str) {
        for _ in 0..3 {
            let e = self.c.find(Locator::Css(css)).await;
            match e.unwrap_or_else(|e| panic!("{css}: {e}")).click().await {
                Err(CmdError::Standard(w)) if w.error == ErrorStatus::StaleElementReference => {}
                r => return r.unwrap_or_else(|e| panic!("{css}: {e}")),
            }
        }
        panic!("{css}: stale three times in a row");
    }

    pub async fn fill(&self, css: &str, text: &str) {
        let e = self
            .c
            .find(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("{css}: {e}"));
        e.clear().await.unwrap();
        e.send_keys(text).await.unwrap();
    }

    /// Waits (polling, up to `within`) until `css` exists.
    pub async fn wait_for(&self, css: &str, within: Duration) -> bool {
        let end = std::time::Instant::now() + within;
        while std::time::Instant::now() < end {
            if self.c.find(Locator::Css(css)).await.is_ok() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        false
    }

    pub async fn eval(&self, js: &str) -> Value {
        self.c.execute(js, vec![]).await.unwrap()
    }

    /// A PNG of the page, for a person to look at.
    pub async fn screenshot(&self, name: &str) {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/console-screenshots");
        std::fs::create_dir_all(&dir).unwrap();
        let png = self.c.screenshot().await.unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    /// The browser console's entries since the last call (chromedriver's
    /// log endpoint): level and message.
    pub async fn console_log(&self) -> Vec<(String, String)> {
        let id = self.c.session_id().await.unwrap().unwrap();
        let url = format!("http://127.0.0.1:{}/session/{id}/se/log", self.port);
        let text = reqwest::Client::new()
            .post(url)
            .header("content-type", "application/json")
            .body(json!({"type": "browser"}).to_string())
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let v: Value = serde_json::from_str(&text).unwrap_or_default();
        v["value"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .map(|e| {
                (
                    e["level"].as_str().unwrap_or("").to_string(),
                    e["message"].as_str().unwrap_or("").to_string(),
                )
            })
            .collect()
    }

    /// Fails on any SEVERE entry in the browser's console.
    pub async fn assert_no_severe(&self, page: &str) {
        let severe: Vec<_> = self
            .console_log()
            .await
            .into_iter()
            .filter(|(level, _)| level == "SEVERE")
            .collect();
        assert!(
            severe.is_empty(),
            "{page}: the browser's console has errors: {severe:?}"
        );
    }

    pub async fn close(self) {
        let _ = self.c.clone().close().await;
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
