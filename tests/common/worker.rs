//! Worker processes, for the suites (and the contention bench) that need several: a copy of
//! the running binary, started with its role in `WAITLOCK_ROLE` and its settings in further
//! environment variables. It answers in lines on stdout and takes lines on stdin; the parent
//! kills it by its pid when done (and on drop, also when it is stopped).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::Instant;

/// The variable that holds a worker's role.
const ROLE: &str = "WAITLOCK_ROLE";

/// The role this process was started with, when it is a worker.
pub fn role() -> Option<String> {
    std::env::var(ROLE).ok()
}

/// The parent's handle on one worker process.
pub struct Proc {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::UnboundedReceiver<String>,
    /// Every line read so far.
    pub seen: Vec<String>,
}

impl Proc {
    /// Starts a copy of this binary as a worker with `role` and the environment `env`.
    pub fn spawn(role: &str, env: &[(&str, String)]) -> Proc {
        let mut cmd = Command::new(std::env::current_exe().expect("this binary's path"));
        cmd.env(ROLE, role);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn a worker process");
        let stdout = child.stdout.take().expect("worker stdout");
        let (tx, lines) = mpsc::unbounded_channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stdin = child.stdin.take();
        Proc {
            child,
            stdin,
            lines,
            seen: Vec::new(),
        }
    }

    /// Waits for a line starting with `prefix`, keeping every line seen.
    pub async fn expect(&mut self, prefix: &str, limit: Duration) -> Result<String, String> {
        let deadline = Instant::now() + limit;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(l)) => {
                    self.seen.push(l.clone());
                    if l.starts_with(prefix) {
                        return Ok(l);
                    }
                }
                Ok(None) => return Err(format!("worker exited before printing {prefix:?}")),
                Err(_) => return Err(format!("no {prefix:?} line within {limit:?}")),
            }
        }
    }

    /// The next line, if one comes before `deadline`.
    pub async fn next_line(&mut self, deadline: Instant) -> Option<String> {
        let l = tokio::time::timeout_at(deadline, self.lines.recv())
            .await
            .ok()??;
        self.seen.push(l.clone());
        Some(l)
    }

    /// Every line printed so far (without waiting).
    pub fn drain(&mut self) -> &[String] {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        &self.seen
    }

    /// Sends one line to the worker's stdin.
    pub fn send(&mut self, line: &str) {
        if let Some(s) = self.stdin.as_mut() {
            let _ = writeln!(s, "{line}");
            let _ = s.flush();
        }
    }

    /// Sends a signal (`-STOP`, `-CONT`, `-KILL`, ...) to the worker, by its pid.
    pub fn signal(&self, sig: &str) {
        let _ = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status();
    }

    /// SIGKILL, and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Asks the worker to exit (`exit` on stdin, then stdin closed); kills it after 5 s.
    pub fn finish(mut self) {
        self.send("exit");
        self.stdin = None;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            // A stopped process would not die of SIGKILL until it is continued on some systems'
            // process accounting; continue it first.
            self.signal("-CONT");
            self.kill();
        }
    }
}

/// The worker's side: lines to the parent (a thread writes them to stdout, in order), and
/// lines from it (a thread reads stdin). Dropping `Pipe` flushes every line sent before.
pub struct Pipe {
    pub out: mpsc::UnboundedSender<String>,
    pub input: mpsc::UnboundedReceiver<String>,
    printer: Option<std::thread::JoinHandle<()>>,
}

impl Pipe {
    pub fn open() -> Pipe {
        let (out, mut rx) = mpsc::unbounded_channel::<String>();
        let printer = std::thread::spawn(move || {
            let mut stdout = std::io::stdout();
            while let Some(line) = rx.blocking_recv() {
                let _ = writeln!(stdout, "{line}");
                let _ = stdout.flush();
            }
        });
        let (tx, input) = mpsc::unbounded_channel::<String>();
        std::thread::spawn(move || {
            for line in std::io::stdin().lock().lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Pipe {
            out,
            input,
            printer: Some(printer),
        }
    }

    /// Sends a line to the parent.
    pub fn say(&self, line: impl Into<String>) {
        let _ = self.out.send(line.into());
    }

    /// Closes the output and waits until every line was written.
    pub fn close(mut self) {
        let (out, _) = mpsc::unbounded_channel();
        drop(std::mem::replace(&mut self.out, out));
        if let Some(p) = self.printer.take() {
            let _ = p.join();
        }
    }
}

/// One field (space-separated, 0-based) of a worker's line as a number; 0 when absent.
pub fn field(line: &str, i: usize) -> u64 {
    line.split(' ')
        .nth(i)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0)
}

/// The end of a locker worker's run, once its tasks are done and the caller dropped its own
/// senders: settles the subscriptions, waits until the locker has no background work, says
/// `L <keys> <waiters> <background tasks>` and `done`, then stays connected until the parent
/// (which looks at Redis meanwhile) says anything.
pub async fn finish_locker<S: waitlock::strategy::Strategy>(
    locker: &waitlock::Locker<S>,
    mut pipe: Pipe,
) {
    let queue = (locker as &dyn std::any::Any).downcast_ref::<waitlock::Locker<waitlock::Queue>>();
    if let Some(l) = queue {
        l.subscriptions_settled().await;
    }
    locker.idle().await;
    let size = queue.map(|l| l.registry_size()).unwrap_or_default();
    pipe.say(format!(
        "L {} {} {}",
        size.keys,
        size.waiters,
        locker.background_tasks()
    ));
    pipe.say("done");
    let _exit = pipe.input.recv().await;
    pipe.close();
}
