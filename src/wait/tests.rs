//! Paused-clock tests of the wait rules.

use super::*;
use crate::options::Backoff;

const CMD: Duration = Duration::from_millis(1000);

fn plan(wait: Duration, backoff: Backoff) -> Plan {
    LockOptions::new()
        .with_wait(wait)
        .with_backoff(backoff)
        .validate("k")
        .expect("valid options")
}

fn request(plan: Plan) -> Request {
    Request {
        names: Names::new("waitlock:", "k").expect("valid key"),
        token: new_token().into(),
        own_token: true,
        plan,
        pid: String::new(),
        refresher: Arc::default(),
    }
}

fn timeout() -> Error {
    Error::Timeout {
        key: "k".into(),
        op: crate::error::Op::Acquire,
        after: CMD,
    }
}

#[tokio::test(start_paused = true)]
async fn an_attempt_gets_the_command_timeout_until_the_deadline_is_closer() {
    let ms = Duration::from_millis;
    let w = Waiting::new(&plan(ms(3000), Backoff::default()));
    assert_eq!(w.limit(CMD, Instant::now()), (CMD, false));
    tokio::time::advance(ms(2500)).await;
    assert_eq!(
        w.limit(CMD, Instant::now()),
        (ms(500), true),
        "cut to the deadline"
    );
    tokio::time::advance(ms(499)).await;
    assert_eq!(w.limit(CMD, Instant::now()), (LAST_ATTEMPT_GRACE, true));
    tokio::time::advance(ms(10)).await;
    assert_eq!(
        w.limit(CMD, Instant::now()),
        (LAST_ATTEMPT_GRACE, true),
        "past the deadline the last attempt still gets its grace"
    );
}

#[tokio::test(start_paused = true)]
async fn wait_zero_means_one_attempt_with_the_whole_command_timeout() {
    let mut w = Waiting::new(&plan(Duration::ZERO, Backoff::default()));
    tokio::time::advance(Duration::from_secs(5)).await;
    assert_eq!(w.limit(CMD, Instant::now()), (CMD, false));
    // A transient failure is not retried: it is the answer.
    assert!(matches!(
        w.failed::<()>(timeout(), false),
        Err(Error::Timeout { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn the_backoff_stays_under_its_cap_the_holders_ttl_and_the_deadline() {
    let ms = Duration::from_millis;
    let mut w = Waiting::new(&plan(ms(10_000), Backoff::exponential(ms(10), ms(80))));
    for _ in 0..200 {
        let d = w.backoff(Instant::now(), None);
        assert!(d <= ms(80), "{d:?} over the cap");
    }
    for _ in 0..50 {
        let d = w.backoff(Instant::now(), Some(ms(3)));
        assert!(d <= ms(4), "{d:?}: at most the holder's PTTL + 1 ms");
    }
    tokio::time::advance(ms(9_990)).await;
    for _ in 0..50 {
        let d = w.backoff(Instant::now(), None);
        assert!(d <= ms(10), "{d:?}: never past the deadline");
    }
    tokio::time::advance(ms(20)).await;
    assert_eq!(w.backoff(Instant::now(), None), Duration::ZERO);
}

#[tokio::test(start_paused = true)]
async fn giving_up_reports_the_last_real_failure_else_wait_timeout() {
    let ms = Duration::from_millis;
    let req = request(plan(ms(3000), Backoff::default()));
    let mut w = Waiting::new(&req.plan);
    w.attempts = 3;
    // A timeout only the deadline caused says nothing about Redis.
    assert!(matches!(w.failed::<()>(timeout(), true), Ok(Step::Failed)));
    tokio::time::advance(ms(3000)).await;
    match w.give_up(&req) {
        Error::WaitTimeout {
            key,
            waited,
            attempts,
        } => {
            assert_eq!(key, "k");
            assert_eq!(waited, ms(3000));
            assert_eq!(attempts, 3);
        }
        e => panic!("expected WaitTimeout, got {e:?}"),
    }
    // A full command timeout is worth reporting instead.
    let mut w = Waiting::new(&req.plan);
    assert!(matches!(w.failed::<()>(timeout(), false), Ok(Step::Failed)));
    assert!(matches!(w.give_up(&req), Error::Timeout { .. }));
    // A non-transient error ends the wait at once.
    let mut w = Waiting::new(&req.plan);
    let wrong = Error::WrongType {
        key: "k".into(),
        redis_key: "{waitlock:k}".into(),
    };
    assert!(matches!(
        w.failed::<()>(wrong, false),
        Err(Error::WrongType { .. })
    ));
}
