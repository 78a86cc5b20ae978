//! TLS fixture: certificates made per test with the `openssl` command line tool, and a private
//! TLS-only `redis-server` (`--port 0 --tls-port P`) that is killed by its pid on drop.
//!
//! A TLS-only server answers no plain-text PING, so readiness is the server's own "Ready to
//! accept connections" log line while the process is alive.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

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
        let dir = super::unique_dir("waitlock-tls");
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

/// A private TLS-only `redis-server` (a [`RedisServer`](super::RedisServer): no persistence,
/// killed by its pid on drop, its log printed when the test fails) with fresh certificates.
pub struct TlsRedis {
    server: super::RedisServer,
    pub port: u16,
    pub certs: Certs,
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
        let path = |name: &str| certs.path(name).to_string_lossy().into_owned();
        let (cert, key, ca) = (path("server.pem"), path("server.key"), path("ca.pem"));
        let mut args = vec![
            "--tls-cert-file",
            &cert,
            "--tls-key-file",
            &key,
            "--tls-ca-cert-file",
            &ca,
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ];
        args.extend_from_slice(extra);
        let server = super::RedisServer::start_tls_only(&args);
        TlsRedis {
            port: server.port,
            server,
            certs,
        }
    }

    /// `rediss://127.0.0.1:P`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// The same server behind a plain-text `redis://` URL (which it does not answer).
    pub fn plain_url(&self) -> String {
        self.server.url()
    }
}
