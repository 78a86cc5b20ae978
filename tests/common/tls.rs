//! TLS fixture: certificates made per test with the `openssl` command line tool, and a private
//! TLS-only `redis-server` (`--port 0 --tls-port P`) that is killed by its pid on drop.
//!
//! A TLS-only server answers no plain-text PING, so readiness is the server's own "Ready to
//! accept connections" log line while the process is alive.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A private CA, a server certificate for 127.0.0.1 and localhost signed by it, a client
/// certificate signed by it, and an unrelated CA: all in a temp dir, removed on drop.
pub struct Certs {
    pub dir: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = match Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
    {
        Ok(out) => out,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
            "`openssl` was not found. The TLS tests make their certificates with it: install it \
             with `sudo apt-get install openssl` (Debian/Ubuntu) or `brew install openssl` (macOS)."
        ),
        Err(e) => panic!("could not run `openssl`: {e}"),
    };
    assert!(
        out.status.success(),
        "openssl {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// EC P-256 keys: fast to make, and both rustls and Redis' OpenSSL take them.
const NEW_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:prime256v1",
    "-nodes",
];

impl Certs {
    /// Makes a fresh set (a few tens of milliseconds).
    pub fn generate() -> Certs {
        let dir = std::env::temp_dir().join(format!(
            "waitlock-tls-{}-{}",
            std::process::id(),
            super::free_port()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create cert dir");
        let certs = Certs { dir };
        certs.make_ca("ca", "waitlock test CA");
        certs.make_ca("other-ca", "unrelated test CA");
        certs.make_leaf(
            "server",
            "localhost",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
            2,
        );
        certs.make_leaf(
            "client",
            "waitlock test client",
            "extendedKeyUsage=clientAuth\n",
            3,
        );
        certs
    }

    fn make_ca(&self, name: &str, cn: &str) {
        let (key, pem, subj) = (
            format!("{name}.key"),
            format!("{name}.pem"),
            format!("/CN={cn}"),
        );
        let mut args = vec!["req", "-x509"];
        args.extend(NEW_KEY);
        args.extend([
            "-keyout",
            &key,
            "-out",
            &pem,
            "-days",
            "2",
            "-subj",
            &subj,
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ]);
        openssl(&self.dir, &args);
    }

    fn make_leaf(&self, name: &str, cn: &str, ext: &str, serial: u32) {
        let (key, csr, pem, extfile, subj) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
            format!("/CN={cn}"),
        );
        std::fs::write(
            self.dir.join(&extfile),
            format!(
                "{ext}basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
            ),
        )
        .expect("write ext file");
        let mut args = vec!["req", "-new"];
        args.extend(NEW_KEY);
        args.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(&self.dir, &args);
        let serial = serial.to_string();
        openssl(
            &self.dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-set_serial",
                &serial,
                "-days",
                "2",
                "-out",
                &pem,
                "-extfile",
                &extfile,
            ],
        );
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    /// The private CA that signed the server and client certificates.
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// A CA that signed nothing here.
    pub fn other_ca(&self) -> PathBuf {
        self.path("other-ca.pem")
    }

    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    pub fn read(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).expect("read cert file")
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A private TLS-only `redis-server` (no persistence), killed by its pid on drop; its log is
/// printed when the test fails.
pub struct TlsRedis {
    child: Option<Child>,
    pub port: u16,
    pub certs: Certs,
    dir: PathBuf,
}

impl TlsRedis {
    /// A TLS-only server with fresh certificates; `auth_clients` asks clients for a
    /// certificate signed by the private CA (`--tls-auth-clients yes`).
    pub fn start(auth_clients: bool) -> TlsRedis {
        Self::start_with(auth_clients, &[])
    }

    /// As [`start`](Self::start), with extra `redis-server` arguments.
    pub fn start_with(auth_clients: bool, extra: &[&str]) -> TlsRedis {
        let certs = Certs::generate();
        let dir = certs.path("redis");
        std::fs::create_dir_all(&dir).expect("create redis dir");
        for _ in 0..5 {
            let port = super::free_port();
            let log = dir.join(format!("redis-{port}.log"));
            let child = Command::new(super::binary())
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--tls-cert-file")
                .arg(certs.path("server.pem"))
                .arg("--tls-key-file")
                .arg(certs.path("server.key"))
                .arg("--tls-ca-cert-file")
                .arg(certs.ca())
                .args([
                    "--tls-auth-clients",
                    if auth_clients { "yes" } else { "no" },
                ])
                .args(extra)
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let mut child = match child {
                Ok(c) => c,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => panic!(
                    "`{}` was not found. These tests run a private Redis: install it with \
                     `sudo apt-get install redis-server` (Debian/Ubuntu) or `brew install redis` \
                     (macOS), or set WAITLOCK_REDIS_SERVER to the binary's path.",
                    super::binary()
                ),
                Err(e) => panic!("could not start `{}`: {e}", super::binary()),
            };
            if await_ready(&mut child, &log) {
                return TlsRedis {
                    child: Some(child),
                    port,
                    certs,
                    dir,
                };
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("a TLS redis-server did not start on a free port after 5 tries");
    }

    /// `rediss://127.0.0.1:P`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The same server behind a plain-text `redis://` URL (which it does not answer).
    pub fn plain_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL by pid, and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join(format!("redis-{}.log", self.port)))
            .unwrap_or_default()
    }
}

/// True once the log says the server accepts connections, false if the process exited (port
/// taken, or a TLS setting it refused: its log is printed) or 10 s passed.
fn await_ready(child: &mut Child, log: &Path) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if let Ok(Some(_)) = child.try_wait() {
            eprintln!("TLS redis-server exited at start:\n{text}");
            return false;
        }
        if text.contains("Ready to accept connections") {
            return true;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    false
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- TLS redis-server log (port {}) ---\n{}",
                self.port,
                self.log()
            );
        }
        self.kill();
    }
}
