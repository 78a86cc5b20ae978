//! Paused-clock tests of the refresher's schedule and task.

use super::super::lease::Hold;
use super::*;

const MS: Duration = Duration::from_millis(1);

fn held(key: &str, refresh: Refresh, ttl: Duration) -> (Held, Arc<Lease>, CancellationToken) {
    let lease = Arc::new(Lease::new(ttl, &Hold::sent(1, Instant::now(), ttl)));
    let lost = CancellationToken::new();
    let h = Held {
        names: Names::new("waitlock:", key).expect("valid key"),
        token: "t".into(),
        pid: String::new(),
        lease: Arc::clone(&lease),
        refresh,
        lost: lost.clone(),
    };
    (h, lease, lost)
}

/// Registers `h` and starts the task with no locker behind it (deadlines are judged; a
/// refresh that comes due ends the task, as when the locker is gone).
fn start(r: &Arc<Refreshing>, h: Held) -> (u64, tokio::task::JoinHandle<()>) {
    let id = {
        let mut reg = r.lock();
        reg.running = true;
        reg.insert(Arc::new(h), (0, 0, true))
    };
    (id, tokio::spawn(Arc::clone(r).run(Weak::new())))
}

#[tokio::test(start_paused = true)]
async fn with_refresh_off_the_token_fires_at_the_validity_deadline_exactly() {
    let r = Arc::new(Refreshing::default());
    let (h, lease, lost) = held("k", Refresh::Off, MS * 1000);
    let deadline = lease.lock().valid_until;
    let (_, task) = start(&r, h);
    lost.cancelled().await;
    assert_eq!(Instant::now(), deadline, "not a tick early or late");
    assert_eq!(lease.lock().lost, Some(LossReason::TtlElapsed));
    task.await.expect("the task ends with nothing left to keep");
    assert_eq!(r.len(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_extend_meanwhile_moves_the_deadline() {
    let t0 = Instant::now();
    let r = Arc::new(Refreshing::default());
    let (h, lease, lost) = held("k", Refresh::Off, MS * 1000);
    let (id, task) = start(&r, h);
    tokio::time::advance(MS * 900).await;
    let sent = lease.sending(MS * 1000, true);
    lease.renewed(sent, MS * 1000);
    r.touch(id);
    lost.cancelled().await;
    assert_eq!(Instant::now(), t0 + MS * 1888);
    task.await.expect("the task ends");
}

#[tokio::test(start_paused = true)]
async fn a_shorter_extend_meanwhile_brings_the_loss_forward() {
    let t0 = Instant::now();
    let r = Arc::new(Refreshing::default());
    let (h, lease, lost) = held("k", Refresh::Off, MS * 1000);
    let (id, task) = start(&r, h);
    tokio::time::advance(MS * 100).await;
    let sent = lease.sending(MS * 200, true);
    r.touch(id);
    lease.renewed(sent, MS * 200);
    r.touch(id);
    lost.cancelled().await;
    assert_eq!(
        Instant::now(),
        t0 + MS * 296,
        "100 + 200 - 4: not at the old 988"
    );
    assert_eq!(lease.lock().lost, Some(LossReason::TtlElapsed));
    task.await.expect("the task ends");
}

#[tokio::test(start_paused = true)]
async fn a_refresher_whose_locker_is_gone_stops_without_judging_the_lock() {
    let r = Arc::new(Refreshing::default());
    let (h, lease, lost) = held("k", Refresh::Every(0.5), MS * 1000);
    let (_, task) = start(&r, h);
    // Due at 500 ms; the locker (the Weak) is gone, so it ends there, and says nothing.
    task.await.expect("the task ends");
    assert!(!lost.is_cancelled());
    assert_eq!(lease.lock().lost, None);
    assert!(Instant::now() < lease.lock().valid_until);
}

#[tokio::test(start_paused = true)]
async fn removing_the_last_lease_ends_the_task_at_once_and_reports_nothing() {
    let r = Arc::new(Refreshing::default());
    let (h, _lease, lost) = held("k", Refresh::Off, MS * 1000);
    let t = Instant::now();
    let (id, task) = start(&r, h);
    r.remove(id);
    task.await.expect("the task ends");
    assert_eq!(Instant::now(), t);
    assert!(!lost.is_cancelled());
}

#[tokio::test(start_paused = true)]
async fn leases_due_close_together_share_a_call_and_each_keeps_its_own_times() {
    let t0 = Instant::now();
    let mut reg = Registry::default();
    // TTL 1 s, refreshed every 500 ms, up to 125 ms early.
    let every = Refresh::Every(0.5);
    let (a, a_lease, _) = held("a", every, MS * 1000);
    let a = reg.insert(Arc::new(a), (0, 0, true));
    tokio::time::advance(MS * 50).await;
    let (b, b_lease, _) = held("b", every, MS * 1000);
    let b = reg.insert(Arc::new(b), (0, 0, true));
    tokio::time::advance(MS * 350).await;
    let (c, c_lease, _) = held("c", every, MS * 1000);
    let c = reg.insert(Arc::new(c), (0, 0, true));
    // A TTL of 60 s in the same schedule: due at 30.4 s.
    let (d, ..) = held("d", every, MS * 60_000);
    let d = reg.insert(Arc::new(d), (0, 0, true));
    assert_eq!(reg.next_wake(), Some(t0 + MS * 500), "a is due first");
    assert!(reg.take(t0 + MS * 499).is_empty(), "nothing is due yet");
    let taken: Vec<u64> = reg.take(t0 + MS * 500).iter().map(|t| t.1).collect();
    assert_eq!(
        taken,
        [a, b],
        "b (due at 550) rides along; c (900) does not"
    );
    // In flight: out of the refresh schedules, still in the deadlines'.
    assert_eq!(reg.next_wake(), Some(t0 + MS * 900));
    assert!(reg.take(t0 + MS * 600).is_empty());
    // c and d are not taken by c's turn: d is 30 s away.
    let taken: Vec<u64> = reg.take(t0 + MS * 900).iter().map(|t| t.1).collect();
    assert_eq!(taken, [c]);
    // c's refresh failed: tried again at its retry time, alone.
    reg.finish(c, Outcome::RetryAt(t0 + MS * 950));
    assert_eq!(reg.next_wake(), Some(t0 + MS * 950));
    // a and b renewed by a call sent at 500 ms: next due 500 ms after it.
    for lease in [&a_lease, &b_lease] {
        lease.renewed(t0 + MS * 500, MS * 1000);
    }
    reg.finish(a, Outcome::Renewed);
    reg.finish(b, Outcome::Renewed);
    assert_eq!(reg.by_due.first(), Some(&(t0 + MS * 950, c)));
    assert!(reg.by_due.contains(&(t0 + MS * 1000, a)));
    // c's deadline passes while nothing renews it: judged then, and only c.
    let c_deadline = c_lease.lock().valid_until;
    assert!(reg.expired(c_deadline - MS).is_empty());
    let expired = reg.expired(c_deadline);
    assert_eq!(expired.len(), 1);
    assert_eq!(expired[0].names.key, "c");
    assert!(reg.entries.contains_key(&d) && reg.entries.contains_key(&b));
    assert!(!reg.entries.contains_key(&c));
}
