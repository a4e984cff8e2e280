//! Log lines to stderr in batches, written by a thread of their own.
//!
//! `tracing-appender`'s non-blocking writer hands each line to its thread
//! through a channel, and that thread wakes for every line: at 30,000
//! attempts a second (one line each) the wake-ups were a tenth of the
//! worker's CPU. Here a line is appended to a shared buffer under a lock;
//! the thread is woken only by the first line into an empty buffer, then
//! waits [`BATCH`] for more and writes them with one `write`. So a line
//! reaches stderr at most [`BATCH`] late, and an idle worker's thread
//! sleeps.
//!
//! Nothing is dropped: past [`HIGH_WATER`] bytes waiting (a stderr that
//! does not keep up), the logging thread writes the batch out itself, and
//! waits for it, as a blocking writer would.

use std::io::Write;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// How long the thread gathers lines after the first one before it writes.
const BATCH: Duration = Duration::from_millis(10);

/// Bytes waiting past which a logging thread writes them out itself.
const HIGH_WATER: usize = 4 << 20;

struct Shared {
    /// Lines not yet written, and whether the writer thread should stop.
    pending: Mutex<(Vec<u8>, bool)>,
    /// Signalled by the first line into an empty buffer, and on stop.
    wake: Condvar,
    /// Where batches go (stderr), locked while a batch is taken and
    /// written, so batches keep their order.
    out: Mutex<Box<dyn Write + Send>>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, (Vec<u8>, bool)> {
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes what is pending and writes it to stderr, in order with any
    /// other batch.
    fn write_out(&self) {
        let mut out = self.out.lock().unwrap_or_else(PoisonError::into_inner);
        let batch = std::mem::take(&mut self.pending().0);
        if !batch.is_empty() {
            // Nowhere to report a failed write to stderr.
            let _ = out.write_all(&batch).and_then(|()| out.flush());
        }
    }
}

/// The writer handed to the `fmt` layer (one per event; cheap to clone).
#[derive(Clone)]
pub(super) struct BatchedStderr {
    shared: Arc<Shared>,
    /// No writer thread: every line is written at once.
    direct: bool,
}

impl Write for BatchedStderr {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut p = self.shared.pending();
        let first = p.0.is_empty();
        p.0.extend_from_slice(line);
        let over = self.direct || p.0.len() >= HIGH_WATER;
        drop(p);
        if first {
            self.shared.wake.notify_one();
        }
        if over {
            self.shared.write_out();
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Stops the writer thread, after it wrote everything, when dropped.
pub(super) struct Flusher {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// How long the exit waits for the last lines to be written: a stderr
/// that never drains (a stuck pipe) must not keep the process alive.
const EXIT_WAIT: Duration = Duration::from_secs(1);

impl Drop for Flusher {
    fn drop(&mut self) {
        self.shared.pending().1 = true;
        self.shared.wake.notify_one();
        let Some(t) = self.thread.take() else {
            return self.shared.write_out();
        };
        let deadline = std::time::Instant::now() + EXIT_WAIT;
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        if t.is_finished() {
            let _ = t.join();
            // Lines logged after the thread's last batch.
            self.shared.write_out();
        }
    }
}

/// The writer and the guard that owns its thread. Falls back to writing
/// in the logging thread (every line at once) if no thread can be started.
pub(super) fn start() -> (BatchedStderr, Flusher) {
    start_to(Box::new(std::io::stderr()))
}

fn start_to(out: Box<dyn Write + Send>) -> (BatchedStderr, Flusher) {
    let shared = Arc::new(Shared {
        pending: Mutex::default(),
        wake: Condvar::new(),
        out: Mutex::new(out),
    });
    let s = shared.clone();
    let thread = std::thread::Builder::new()
        .name("redeliver-log".into())
        .spawn(move || run(&s))
        .ok();
    let writer = BatchedStderr {
        shared: shared.clone(),
        direct: thread.is_none(),
    };
    (writer, Flusher { shared, thread })
}

fn run(shared: &Shared) {
    loop {
        let mut p = shared.pending();
        while p.0.is_empty() && !p.1 {
            p = shared.wake.wait(p).unwrap_or_else(PoisonError::into_inner);
        }
        let stopping = p.1;
        drop(p);
        if !stopping {
            std::thread::sleep(BATCH);
        }
        shared.write_out();
        if stopping {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sink the test can read.
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Sink {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn lines_arrive_in_order_soon_after_and_all_on_drop() {
        let sink = Sink::default();
        let (mut w, guard) = start_to(Box::new(sink.clone()));
        w.write_all(b"one\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while sink.text().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(
            sink.text(),
            "one\n",
            "a lone line is written within the batch time"
        );
        let writers: Vec<_> = (0..4)
            .map(|t| {
                let mut w = w.clone();
                std::thread::spawn(move || {
                    for i in 0..1000 {
                        w.write_all(format!("{t}-{i}\n").as_bytes()).unwrap();
                    }
                })
            })
            .collect();
        for t in writers {
            t.join().unwrap();
        }
        drop(guard);
        let text = sink.text();
        assert_eq!(text.lines().count(), 4001, "nothing dropped");
        for t in 0..4 {
            let mine: Vec<_> = text
                .lines()
                .filter(|l| l.starts_with(&format!("{t}-")))
                .collect();
            let want: Vec<_> = (0..1000).map(|i| format!("{t}-{i}")).collect();
            assert_eq!(mine, want, "each thread's lines in its order");
        }
    }

    #[test]
    fn past_the_high_water_the_logging_thread_writes_itself() {
        let sink = Sink::default();
        let (mut w, _guard) = start_to(Box::new(sink.clone()));
        let big = vec![b'x'; HIGH_WATER];
        w.write_all(&big).unwrap();
        // Written before write_all returned, without waiting for the batch.
        assert_eq!(sink.0.lock().unwrap().len(), HIGH_WATER);
    }
}
