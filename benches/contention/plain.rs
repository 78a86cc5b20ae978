//! The plain lock pair, for the contention bench's `plain` row (uncontended): `SET key token
//! NX PX` to take a key, a script that deletes it if it still holds the token to release it.
//! What rslock, redsync and most Redis locks do per pair, driven by the same bench workers
//! through fred, so waitlock's uncontended pairs per second and Redis CPU per pair read against
//! it on the same machine and server (the `ceiling` rows drive Redis with `redis-benchmark`,
//! differently).
//!
//! Not waitlock: no fence, no queue, no wake-up, no refresh.

use waitlock::fred::prelude::*;
use waitlock::fred::types::scripts::Script;
use waitlock::fred::types::{Expiration, SetOptions};

const RELEASE: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// One worker process's connection and release script.
pub struct Plain {
    client: Client,
    release: Script,
}

impl Plain {
    /// Connects one command connection to `url` (a locker's command connection) and loads
    /// the release script.
    pub async fn connect(url: &str) -> Plain {
        let config = Config::from_url(url).expect("url");
        let client = Builder::from_config(config).build().expect("plain client");
        client.init().await.expect("plain connect");
        let release = Script::from_lua(RELEASE);
        release.load(&client).await.expect("load plain release");
        Plain { client, release }
    }

    /// Takes `key` as `token`: it must be free (the row is uncontended).
    pub async fn acquire(&self, key: &str, token: &str) {
        let set: Option<String> = self
            .client
            .set(
                key,
                token,
                Some(Expiration::PX(30_000)),
                Some(SetOptions::NX),
                false,
            )
            .await
            .expect("plain SET NX PX");
        assert!(set.is_some(), "plain: {key} was held");
    }

    /// Releases `key` held as `token`.
    pub async fn release(&self, key: &str, token: &str) {
        let r: i64 = self
            .release
            .evalsha(&self.client, vec![key.to_owned()], vec![token.to_owned()])
            .await
            .expect("plain release");
        assert_eq!(r, 1, "plain: {key} was not held by {token}");
    }
}
