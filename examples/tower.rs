//! A fleet-wide concurrency limit on a real HTTP service: every instance of this server lets
//! at most 4 requests run at once *across all instances* (one Redis semaphore), serves the
//! waiting ones in order, and answers 503 to a request that waited 2 s for a slot.
//!
//! ```sh
//! cargo run --example tower --features tower              # listens on 127.0.0.1:8080
//! PORT=8081 cargo run --example tower --features tower    # a second instance
//! for i in $(seq 20); do curl -s localhost:8080/ & curl -s localhost:8081/ & done; wait
//! ```
//!
//! The HTTP part is a minimal HTTP/1.1 server on tokio (one request per connection), so the
//! example needs nothing beyond tower's traits; with hyper or axum the layer goes in the same
//! place (`ServiceBuilder::new().layer(limit).service(app)`).

use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tower_layer::Layer;
use tower_service::Service;
use waitlock::tower::ConcurrencyLimitLayer;
use waitlock::{Error, LockOptions, Locker};

/// The application: 300 ms of "work", then a small page.
#[derive(Clone)]
struct App;

impl Service<String> for App {
    type Response = String;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<String, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, path: String) -> Self::Future {
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok(format!("done: {path}\n"))
        })
    }
}

fn response(status: &str, body: &str) -> String {
    format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let port = std::env::var("PORT").unwrap_or_else(|_| "8080".into());
    let locker = Locker::connect(&url).await?.queued().build().await?;
    let limit = ConcurrencyLimitLayer::new(
        locker.semaphore(4)?,
        "example-api-in-flight",
        LockOptions::new()
            .with_ttl(Duration::from_secs(10))
            .with_wait(Duration::from_secs(2)),
    );
    let listener = TcpListener::bind(format!("127.0.0.1:{port}")).await?;
    println!("listening on 127.0.0.1:{port}: at most 4 requests at once across every instance");
    loop {
        let (mut socket, _) = listener.accept().await?;
        let mut service = limit.layer(App);
        tokio::spawn(async move {
            let mut buf = vec![0u8; 4096];
            let n = socket.read(&mut buf).await.unwrap_or(0);
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split(' ').nth(1).unwrap_or("/").to_owned();
            let reply = match poll_fn(|cx| service.poll_ready(cx)).await {
                Err(e) => match e.downcast_ref::<Error>() {
                    Some(Error::WaitTimeout { .. }) => {
                        response("503 Service Unavailable", "busy, try again\n")
                    }
                    _ => response("500 Internal Server Error", &format!("{e}\n")),
                },
                Ok(()) => match service.call(path).await {
                    Ok(body) => response("200 OK", &body),
                    Err(e) => response("500 Internal Server Error", &format!("{e}\n")),
                },
            };
            let _ = socket.write_all(reply.as_bytes()).await;
        });
    }
}
