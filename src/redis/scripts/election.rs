//! The election's calls: a new leader's announcement, a resignation mark, and who leads
//! (`crate::election`; the scripts are `lua/elect_*.lua`).

use super::{ms, text, unexpected, Lua, Via};
use crate::error::{Op, Result};
use crate::keys::Names;
use crate::redis::{Client, Engine};
use fred::types::{FromValue, Value};

impl Engine {
    /// Election: `token` (which holds `names`' lock, with fence `term`) makes the election's
    /// record its own, with `value`, living `life` (see [`Engine::keep_record`]). `Ok(None)`:
    /// the token no longer holds the lock; `Ok(Some(previous record))` (empty when there was
    /// none).
    pub(crate) async fn announce(
        &self,
        names: &Names,
        token: &str,
        term: u64,
        value: &str,
        life: std::time::Duration,
    ) -> Result<Option<String>> {
        let args = vec![
            token.to_owned(),
            term.to_string(),
            value.to_owned(),
            ms(life).to_string(),
        ];
        let client = self.backend.client_for(token);
        let reply: Vec<Value> = self
            .election_call(client, &self.scripts.announce, names, args)
            .await?;
        match reply.as_slice() {
            [code, ..] if code.as_i64() == Some(0) => Ok(None),
            [code, prev] if code.as_i64() == Some(1) => Ok(Some(text(prev).unwrap_or_default())),
            _ => Err(unexpected(names, Op::Acquire, &[])),
        }
    }

    /// Election: the leader's record lives `life` more (a leader keeps it alive while it
    /// leads; one that dies leaves it to expire, its lease plus the retention later). A plain
    /// `PEXPIRE`: a record rewritten by a newer leader meanwhile is kept alive by it anyway.
    pub(crate) async fn keep_record(
        &self,
        names: &Names,
        token: &str,
        life: std::time::Duration,
    ) -> Result<()> {
        use fred::interfaces::ClientLike;
        use fred::types::{ClusterHash, CustomCommand};
        let client = self.backend.client_for(token);
        let pexpire = CustomCommand::new_static("PEXPIRE", ClusterHash::FirstKey, false);
        let args: Vec<Value> = vec![names.leader().into(), ms(life).to_string().into()];
        let call = client.custom::<i64, _>(pexpire, args);
        let outcome = tokio::time::timeout(self.settings.command_timeout, call).await;
        self.outcome(
            client,
            names,
            Op::Extend,
            self.settings.command_timeout,
            outcome,
        )
        .map(drop)
    }

    /// Election: marks `token`'s record resigned (kept for the retention). True when it was
    /// `token`'s.
    pub(crate) async fn resign_record(&self, names: &Names, token: &str) -> Result<bool> {
        let args = vec![token.to_owned(), ms(self.settings.retention).to_string()];
        let client = self.backend.client_for(token);
        let marked: i64 = self
            .election_call(client, &self.scripts.resign, names, args)
            .await?;
        Ok(marked == 1)
    }

    /// An election script on `client` with its `KEYS` (the lock, the record) and `args`.
    async fn election_call<R: FromValue>(
        &self,
        client: &Client,
        lua: &Lua,
        names: &Names,
        args: Vec<String>,
    ) -> Result<R> {
        let keys = vec![names.lock.clone(), names.leader()];
        self.eval_with(
            client,
            lua,
            names,
            keys,
            args,
            self.settings.command_timeout,
            Via::Sha,
        )
        .await
    }

    /// Election: the lock's value (empty when free), its PTTL, the record (empty when none)
    /// and Redis' time (µs), read in one call.
    pub(crate) async fn read_leader(&self, names: &Names) -> Result<(String, i64, String, u64)> {
        let client = self.backend.next_client();
        let reply: Vec<Value> = self
            .election_call(client, &self.scripts.read_leader, names, Vec::new())
            .await?;
        match reply.as_slice() {
            [lock, pttl, record, now] => Ok((
                text(lock).unwrap_or_default(),
                pttl.as_i64().unwrap_or(-2),
                text(record).unwrap_or_default(),
                now.as_i64().unwrap_or(0).max(0) as u64,
            )),
            _ => Err(unexpected(names, Op::Status, &[])),
        }
    }
}
