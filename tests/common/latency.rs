//! A TCP proxy in front of a server that delays what the server sends by a fixed latency
//! (each chunk as it arrives, in order, none held behind another's delay): a far Redis, for
//! tests of what waits on round trips.

use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::Instant;

/// The proxy; it stops (and drops its connections' forwarding) when dropped.
pub struct Latency {
    /// The port to connect to (`127.0.0.1`).
    pub port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl Latency {
    /// A proxy to `127.0.0.1:upstream` whose replies arrive `latency` late.
    pub async fn start(upstream: u16, latency: Duration) -> Latency {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the latency proxy");
        let port = listener.local_addr().expect("the proxy's address").port();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, upstream, latency));
            }
        });
        Latency { port, task }
    }

    /// The URL of the server through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }
}

impl Drop for Latency {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn forward(client: TcpStream, upstream: u16, latency: Duration) {
    let Ok(server) = TcpStream::connect(("127.0.0.1", upstream)).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut from_client, mut to_client) = client.into_split();
    let (mut from_server, mut to_server) = server.into_split();
    tokio::spawn(async move {
        let _ = tokio::io::copy(&mut from_client, &mut to_server).await;
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    tokio::spawn(async move {
        while let Some((due, bytes)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to_client.write_all(&bytes).await.is_err() {
                return;
            }
        }
    });
    let mut buf = vec![0; 64 * 1024];
    loop {
        match from_server.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if tx
                    .send((Instant::now() + latency, buf[..n].to_vec()))
                    .is_err()
                {
                    return;
                }
            }
        }
    }
}
