//! Unlock, Renew and Proclaim: acting on held keys, by the session that
//! holds them or by fencing token.
//!
//! With access control, acting by fence on another session's lock belongs
//! to the identity that took it (or an admin). Who took each fence is part
//! of the table (`table::takers`), so the check reads the same record on
//! both engines, after a read index on a cluster: a grant committed under
//! an earlier leader is known. A fence's taker never changes once noted,
//! so no command in between can make the answer wrong.

use super::reply::{self, Refusal};
use super::validate::{check_value, checked_keys, fence_of, renew_lease};
use super::{Answer, Conn, Service};
use crate::ops::acl::Identity;
use crate::table::{Command, Key, OwnerId, Reply};
use dlock_proto::proto::{Request, RequestType, ResponseStatus};

impl Service {
    /// Unlock or Renew (`kind`).
    pub(super) async fn release(
        &self,
        conn: &Conn,
        mut req: Request,
        kind: RequestType,
        who: Option<&Identity>,
    ) -> Result<Answer, Refusal> {
        let id = req.id;
        self.named_if_any(conn, req.session)?;
        let body = req.lock.take().unwrap_or_default();
        let fence = fence_of(&body);
        let lease = match kind {
            RequestType::Renew => Some(renew_lease(&self.config, body.release_micro)?),
            _ => None,
        };
        let keys = checked_keys(&self.config, body.keys)?;
        let owner = self.owner(conn, req.session).await?;
        if let Some(fence) = fence {
            self.check_fence(who, owner, &keys, fence).await?;
        }
        let cmd = match lease {
            Some(lease) => Command::Renew {
                owner,
                keys,
                fence,
                lease,
            },
            None => Command::Unlock { owner, keys, fence },
        };
        let out = self.engine.submit(self.numbered(&req, cmd)).await?;
        match out.reply {
            Reply::NotHeld(not_held) => Ok(Answer::Now(reply::held_result(id, not_held))),
            other => Err(self.unexpected(conn, owner, req.seq, other)),
        }
    }

    /// Proclaim: a new value for held keys. By fence, any client may
    /// proclaim (subject to access control): no session is needed.
    pub(super) async fn proclaim(
        &self,
        conn: &Conn,
        req: Request,
        who: Option<&Identity>,
    ) -> Result<Answer, Refusal> {
        let id = req.id;
        self.named_if_any(conn, req.session)?;
        let body = req.lock.unwrap_or_default();
        let fence = fence_of(&body);
        check_value(&body.value)?;
        let keys = checked_keys(&self.config, body.keys)?;
        let owner = match fence {
            Some(fence) => {
                self.check_fence(who, 0, &keys, fence).await?;
                0
            }
            None => self.owner(conn, req.session).await?,
        };
        let cmd = Command::Proclaim {
            owner,
            keys,
            fence,
            value: body.value,
        };
        match self.engine.submit(cmd).await?.reply {
            Reply::NotHeld(not_held) => Ok(Answer::Now(reply::held_result(id, not_held))),
            other => Err(self.unexpected(conn, owner, 0, other)),
        }
    }

    /// With access control, Unlock, Renew and Proclaim by `fence` act on
    /// another owner's lock only for the identity that took it, or for an
    /// admin. A fence not issued yet is refused as well: whoever names it
    /// guessed.
    async fn check_fence(
        &self,
        who: Option<&Identity>,
        owner: OwnerId,
        keys: &[Key],
        fence: u64,
    ) -> Result<(), Refusal> {
        let Some(who) = who.filter(|w| !w.is_admin()) else {
            return Ok(());
        };
        self.engine.read_index().await?;
        let denied = self.engine.read(|table, _| {
            fence >= table.next_fence()
                || (table.fence_held_by_another(keys, fence, owner)
                    && table.taker(fence) != Some(who.name.as_str()))
        });
        if denied {
            return Err(Refusal::new(
                ResponseStatus::AccessDenied,
                who.not_your_fence(),
            ));
        }
        Ok(())
    }
}
