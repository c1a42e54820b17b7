//! Leader election on a coordination.k8s.io Lease, with optimistic concurrency on its resourceVersion.
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, ObjectMeta, PostParams};

use super::error::Result;

pub struct LeaseLock {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub duration: Duration,
}

/// What a holder may do with the lease it found, at `now`.
#[derive(Debug, PartialEq, Eq)]
pub enum Decision {
    /// Nobody holds it, it expired, or we hold it: write ourselves in.
    Take { transition: bool },
    /// Someone else holds a fresh lease.
    Wait,
}

/// Pure: may `identity` take or renew `spec` at `now`?
pub fn decide(spec: Option<&LeaseSpec>, identity: &str, now: Timestamp) -> Decision {
    let Some(spec) = spec else {
        return Decision::Take { transition: true };
    };
    match spec.holder_identity.as_deref() {
        None | Some("") => Decision::Take { transition: true },
        Some(h) if h == identity => Decision::Take { transition: false },
        Some(_) => {
            let renewed = spec.renew_time.as_ref().map(|t| t.0);
            let secs = i64::from(spec.lease_duration_seconds.unwrap_or(15));
            match renewed {
                Some(t) if t + SignedDuration::from_secs(secs) > now => Decision::Wait,
                _ => Decision::Take { transition: true },
            }
        }
    }
}

/// `leaseDurationSeconds` (an `int32`) for a lease of `d`: longer ones are held for `i32::MAX`
/// seconds, not wrapped to a lease that is expired at once or negative.
fn lease_seconds(d: Duration) -> i32 {
    i32::try_from(d.as_secs()).unwrap_or(i32::MAX)
}

impl LeaseLock {
    fn spec(&self, now: Timestamp, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(lease_seconds(self.duration)),
            acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(transitions),
            ..Default::default()
        }
    }

    /// One attempt to acquire or renew. `Ok(true)` while we hold the lease.
    pub async fn try_acquire(&self) -> Result<bool> {
        let now = Timestamp::now();
        let Some(mut lease) = self.api.get_opt(&self.name).await? else {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.name.clone()),
                    ..Default::default()
                },
                spec: Some(self.spec(now, 0, None)),
            };
            return match self.api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
                Err(e) => Err(e.into()),
            };
        };
        let Decision::Take { transition } = decide(lease.spec.as_ref(), &self.identity, now) else {
            return Ok(false);
        };
        let old = lease.spec.take().unwrap_or_default();
        let transitions = old.lease_transitions.unwrap_or(0) + i32::from(transition);
        let acquired = if transition { None } else { old.acquire_time };
        lease.spec = Some(self.spec(now, transitions, acquired));
        match self
            .api
            .replace(&self.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Give the lease up so a standby takes over at once.
    pub async fn release(&self) -> Result<()> {
        if let Some(mut lease) = self.api.get_opt(&self.name).await?
            && let Some(spec) = lease.spec.as_mut()
            && spec.holder_identity.as_deref() == Some(&self.identity)
        {
            spec.holder_identity = None;
            self.api
                .replace(&self.name, &PostParams::default(), &lease)
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held_by(who: &str, renewed_at: i64) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(who.into()),
            lease_duration_seconds: Some(15),
            renew_time: Some(MicroTime(Timestamp::from_second(renewed_at).unwrap())),
            ..Default::default()
        }
    }

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(s).unwrap()
    }

    #[test]
    fn missing_or_released_lease_is_taken() {
        assert_eq!(
            decide(None, "me", at(100)),
            Decision::Take { transition: true }
        );
        let released = LeaseSpec {
            holder_identity: None,
            ..held_by("x", 100)
        };
        assert_eq!(
            decide(Some(&released), "me", at(100)),
            Decision::Take { transition: true }
        );
    }

    #[test]
    fn a_lease_too_long_for_int32_is_held_longest_not_wrapped() {
        assert_eq!(lease_seconds(Duration::from_secs(15)), 15);
        // `as i32` made these a 15-second lease and a negative one
        assert_eq!(lease_seconds(Duration::from_secs((1 << 32) + 15)), i32::MAX);
        assert_eq!(lease_seconds(Duration::from_secs(1 << 31)), i32::MAX);
    }

    #[test]
    fn own_lease_is_renewed_without_a_transition() {
        assert_eq!(
            decide(Some(&held_by("me", 100)), "me", at(101)),
            Decision::Take { transition: false }
        );
    }

    #[test]
    fn fresh_foreign_lease_waits_and_expired_one_is_taken() {
        assert_eq!(
            decide(Some(&held_by("other", 100)), "me", at(114)),
            Decision::Wait
        );
        assert_eq!(
            decide(Some(&held_by("other", 100)), "me", at(116)),
            Decision::Take { transition: true }
        );
    }
}
