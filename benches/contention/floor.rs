//! The floor of a woken handoff, for the contention bench's `floor` row: the least any queue
//! handoff in two calls makes Redis do, so that waitlock's Redis CPU per acquisition can be
//! read against what no protocol of two calls can go below on the same machine and server.
//!
//! Not a lock anyone should use: no fence, no lease at return, no watchers, no presence, no
//! crash detection, no timeouts, no reconnects. A waiter that finds the key held pushes
//! `<channel> <token>` onto a list; a release pops the oldest, sets the key to its token and
//! publishes the token on its process's channel (sharded, as waitlock does). Each process has
//! one command connection and one subscriber connection, as a waitlock process has. Per
//! acquisition: a queueing attempt (`EVALSHA`, `SET NX`, `RPUSH`) and a release that grants
//! (`EVALSHA`, `GET`, `LPOP`, `SET`, `SPUBLISH`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::oneshot;
use waitlock::fred::clients::SubscriberClient;
use waitlock::fred::prelude::*;
use waitlock::fred::types::scripts::Script;

const ACQUIRE: &str = r"
if redis.call('set', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return 1 end
redis.call('rpush', KEYS[2], ARGV[3] .. ' ' .. ARGV[1])
return 0";

const RELEASE: &str = r"
if redis.call('get', KEYS[1]) ~= ARGV[1] then return -1 end
local next = redis.call('lpop', KEYS[2])
if not next then redis.call('del', KEYS[1]) return 0 end
local sp = string.find(next, ' ', 1, true)
local token = string.sub(next, sp + 1)
redis.call('set', KEYS[1], token, 'PX', ARGV[2])
redis.call('spublish', string.sub(next, 1, sp - 1), token)
return 1";

/// The lease a grant sets: long, since nothing here refreshes or recovers.
const PX: &str = "30000";

type Waiting = Arc<Mutex<HashMap<String, oneshot::Sender<()>>>>;

/// One worker process's handoff floor: its connections and its waiting tasks.
pub struct Floor {
    client: Client,
    channel: String,
    waiting: Waiting,
    acquire: Script,
    release: Script,
    _subscriber: SubscriberClient,
}

impl Floor {
    /// Connects a command and a subscriber connection to `url` and listens on this process's
    /// channel.
    pub async fn connect(url: &str) -> Floor {
        let config = Config::from_url(url).expect("url");
        let client = Builder::from_config(config.clone())
            .build()
            .expect("floor client");
        client.init().await.expect("floor connect");
        let subscriber = Builder::from_config(config)
            .build_subscriber_client()
            .expect("floor subscriber");
        subscriber.init().await.expect("floor subscriber connect");
        let channel = format!("floor:w:{}", std::process::id());
        let waiting: Waiting = Arc::default();
        let mut messages = subscriber.message_rx();
        let routes = waiting.clone();
        tokio::spawn(async move {
            while let Ok(m) = messages.recv().await {
                let token = m.value.as_string().unwrap_or_default();
                if let Some(tx) = routes.lock().expect("routes").remove(&token) {
                    let _ = tx.send(());
                }
            }
        });
        // SSUBSCRIBE waits for its reply: the channel is live when this returns.
        subscriber
            .ssubscribe(channel.clone())
            .await
            .expect("floor ssubscribe");
        let (acquire, release) = (Script::from_lua(ACQUIRE), Script::from_lua(RELEASE));
        acquire.load(&client).await.expect("load floor acquire");
        release.load(&client).await.expect("load floor release");
        Floor {
            client,
            channel,
            waiting,
            acquire,
            release,
            _subscriber: subscriber,
        }
    }

    /// Waits for `key` as `token`: one call, then the grant's message if the key was held.
    pub async fn acquire(&self, key: &str, token: &str) {
        let (tx, rx) = oneshot::channel();
        // Registered before the call, so a grant cannot come before its waiter.
        self.waiting
            .lock()
            .expect("waiting")
            .insert(token.to_owned(), tx);
        let got: i64 = self
            .acquire
            .evalsha(
                &self.client,
                vec![key.to_owned(), format!("{key}:q")],
                vec![token, PX, &self.channel],
            )
            .await
            .expect("floor acquire");
        if got == 1 {
            self.waiting.lock().expect("waiting").remove(token);
        } else {
            tokio::time::timeout(Duration::from_secs(60), rx)
                .await
                .expect("floor grant within 60 s")
                .expect("floor grant");
        }
    }

    /// Releases `key` held as `token`, handing it to the oldest waiter.
    pub async fn release(&self, key: &str, token: &str) {
        let r: i64 = self
            .release
            .evalsha(
                &self.client,
                vec![key.to_owned(), format!("{key}:q")],
                vec![token, PX],
            )
            .await
            .expect("floor release");
        assert!(r >= 0, "floor: {key} was not held by {token}");
    }
}
