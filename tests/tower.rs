//! The fleet-wide concurrency limit (`waitlock::tower`, issue 35) against a real private
//! redis-server: 4 instances x 32 concurrent requests never run more than N at once, a request
//! that waits past its deadline is shed, a dropped response gives its permit back, and a lost
//! permit cancels its request.

mod common;

use common::RedisServer;
use std::convert::Infallible;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;
use tower_layer::Layer;
use tower_service::Service;
use waitlock::tower::{BoxError, ConcurrencyLimitLayer};
use waitlock::{Error, LockOptions, Locker, Queue};

/// Counts the requests running now (and the most at once), each taking `hold` (`None`:
/// never ending).
#[derive(Clone)]
struct Work {
    running: Arc<AtomicUsize>,
    most: Arc<AtomicUsize>,
    hold: Option<Duration>,
}

impl Work {
    fn new(hold: Option<Duration>) -> Work {
        Work {
            running: Arc::default(),
            most: Arc::default(),
            hold,
        }
    }
}

impl Service<()> for Work {
    type Response = ();
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<(), Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, (): ()) -> Self::Future {
        let (running, most, hold) = (self.running.clone(), self.most.clone(), self.hold);
        Box::pin(async move {
            let now = running.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            struct Done(Arc<AtomicUsize>);
            impl Drop for Done {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::SeqCst);
                }
            }
            let _done = Done(running);
            match hold {
                Some(d) => tokio::time::sleep(d).await,
                None => std::future::pending().await,
            }
            Ok(())
        })
    }
}

async fn locker(server: &RedisServer) -> Locker<Queue> {
    Locker::builder(server.client().await)
        .queued()
        .build()
        .await
        .expect("queued locker")
}

/// One request through `service`: ready (a permit), then the call.
async fn request<S>(service: &mut S) -> Result<(), BoxError>
where
    S: Service<(), Response = (), Error = BoxError>,
{
    poll_fn(|cx| service.poll_ready(cx)).await?;
    service.call(()).await
}

fn is_error(e: &BoxError, want: fn(&Error) -> bool) -> bool {
    e.downcast_ref::<Error>().is_some_and(want)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_instances_of_32_requests_never_run_more_than_n_at_once() {
    let server = RedisServer::start();
    let n = 3;
    let work = Work::new(Some(Duration::from_millis(15)));
    let opts = LockOptions::new()
        .with_ttl(Duration::from_secs(10))
        .with_wait(Duration::from_secs(120));
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let instance = locker(&server).await;
        let layer = ConcurrencyLimitLayer::new(
            instance.semaphore(n).expect("semaphore"),
            "api",
            opts.clone(),
        );
        for _ in 0..32 {
            let mut service = layer.layer(work.clone());
            tasks.push(tokio::spawn(async move { request(&mut service).await }));
        }
    }
    for t in tasks {
        t.await.expect("task").expect("every request runs");
    }
    let most = work.most.load(Ordering::SeqCst);
    println!("128 requests over 4 instances, at most {most} at once (limit {n})");
    assert!(most <= n as usize, "{most} ran at once, limit {n}");
    assert_eq!(
        most, n as usize,
        "the limit was never reached: the test proves nothing"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_waits_past_its_deadline_is_shed() {
    let server = RedisServer::start();
    let l = locker(&server).await;
    let slow = Work::new(None);
    let wait = Duration::from_millis(200);
    let layer = ConcurrencyLimitLayer::new(
        l.semaphore(1).expect("semaphore"),
        "shed",
        LockOptions::new().with_wait(wait),
    );
    let mut first = layer.layer(slow.clone());
    poll_fn(|cx| first.poll_ready(cx))
        .await
        .expect("the first gets the permit");
    let running = tokio::spawn(first.call(()));
    let mut second = layer.layer(slow.clone());
    let start = Instant::now();
    let shed = poll_fn(|cx| second.poll_ready(cx))
        .await
        .expect_err("no permit within the deadline");
    let took = start.elapsed();
    assert!(
        is_error(&shed, |e| matches!(e, Error::WaitTimeout { .. })),
        "{shed}"
    );
    assert!(took >= wait, "shed after {took:?}, before the deadline");
    running.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_response_gives_its_permit_back() {
    let server = RedisServer::start();
    let l = locker(&server).await;
    let layer = ConcurrencyLimitLayer::new(
        l.semaphore(1).expect("semaphore"),
        "dropped",
        LockOptions::new().with_wait(Duration::from_secs(30)),
    );
    let mut first = layer.layer(Work::new(None));
    poll_fn(|cx| first.poll_ready(cx)).await.expect("permit");
    let response = first.call(());
    let sem = l.semaphore(1).expect("semaphore");
    assert_eq!(sem.status("dropped").await.expect("status").held, 1);
    // A second request waits; dropping the first response lets it in.
    let mut second = layer.layer(Work::new(Some(Duration::from_millis(1))));
    let waiting = tokio::spawn(async move { request(&mut second).await });
    common::permits_queued(&sem, "dropped", 1)
        .await
        .expect("the second request queued");
    drop(response);
    tokio::time::timeout(Duration::from_secs(10), waiting)
        .await
        .expect("the second request got the permit")
        .expect("task")
        .expect("it ran");
    l.idle().await;
    assert_eq!(sem.status("dropped").await.expect("status").held, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_permit_cancels_its_request() {
    let server = RedisServer::start();
    let admin = server.client().await;
    let l = locker(&server).await;
    let work = Work::new(None);
    let layer = ConcurrencyLimitLayer::new(
        l.semaphore(2).expect("semaphore"),
        "lost",
        LockOptions::new()
            .with_ttl(Duration::from_millis(400))
            .with_refresh_ratio(0.25),
    );
    let mut service = layer.layer(work.clone());
    poll_fn(|cx| service.poll_ready(cx)).await.expect("permit");
    let response = tokio::spawn(service.call(()));
    common::eventually("the request runs", Duration::from_secs(10), || {
        work.running.load(Ordering::SeqCst) == 1
    })
    .await;
    // The holders' set deleted behind the request: its next refresh finds the permit gone.
    let _: i64 = common::cmd(&admin, "DEL", vec![common::permit_key("lost").into()]).await;
    let out = tokio::time::timeout(Duration::from_secs(10), response)
        .await
        .expect("the request ended")
        .expect("task");
    let e = out.expect_err("cancelled");
    assert!(is_error(&e, |e| matches!(e, Error::Expired { .. })), "{e}");
    assert_eq!(
        work.running.load(Ordering::SeqCst),
        0,
        "the inner future was dropped"
    );
}
