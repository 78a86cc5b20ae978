//! The scenario runner of the `harness = false` suites (their binaries are also their worker
//! processes): runs each scenario under a time limit on one runtime, prints one line per
//! scenario and a summary, honours a name filter (`cargo test NAME` passes it to every test
//! binary) and exits non-zero when one failed.

use std::future::Future;
use std::io::Write;
use std::time::Duration;

/// A runtime like the tests': multi-thread, two workers.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

pub struct Runner {
    pub rt: tokio::runtime::Runtime,
    filter: Vec<String>,
    passed: usize,
    failed: usize,
    skipped: usize,
}

impl Runner {
    pub fn new() -> Runner {
        // libtest's own flags (`--nocapture`, `--test-threads=1`, ...) mean nothing here; any
        // other argument is a name filter, as with libtest.
        let filter = std::env::args()
            .skip(1)
            .filter(|a| !a.starts_with('-'))
            .collect();
        Runner {
            rt: runtime(),
            filter,
            passed: 0,
            failed: 0,
            skipped: 0,
        }
    }

    /// Whether a scenario of this name runs (every one when no filter was given).
    pub fn selected(&self, name: &str) -> bool {
        self.filter.is_empty() || self.filter.iter().any(|f| name.contains(f.as_str()))
    }

    /// Runs one scenario (when selected) and prints its line.
    pub fn run<F>(&mut self, name: &str, limit: Duration, scenario: F)
    where
        F: Future<Output = Result<String, String>>,
    {
        if !self.selected(name) {
            self.skipped += 1;
            return;
        }
        let t = std::time::Instant::now();
        print!("test {name} ... ");
        let _ = std::io::stdout().flush();
        match self
            .rt
            .block_on(async { tokio::time::timeout(limit, scenario).await })
        {
            Ok(Ok(line)) => {
                self.passed += 1;
                println!("ok ({:.1} s): {line}", t.elapsed().as_secs_f64());
            }
            Ok(Err(e)) => {
                self.failed += 1;
                println!("FAILED ({:.1} s): {e}", t.elapsed().as_secs_f64());
            }
            Err(_) => {
                self.failed += 1;
                println!("FAILED: no end within {limit:?}");
            }
        }
    }

    /// Prints the summary line; the exit code `main` returns (1 when a scenario failed), so
    /// that `main`'s servers are dropped (killed) before the process exits.
    pub fn finish(self, suite: &str) -> std::process::ExitCode {
        println!(
            "{suite}: {} passed, {} failed, {} filtered out",
            self.passed, self.failed, self.skipped
        );
        if self.failed > 0 {
            std::process::ExitCode::FAILURE
        } else {
            std::process::ExitCode::SUCCESS
        }
    }
}
