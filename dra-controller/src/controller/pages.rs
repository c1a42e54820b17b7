//! Cluster-wide lists read page by page: a reconcile then holds one page of response body and
//! decoded objects at a time, not every Node or claim of a large cluster at once.
use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, ListParams};
use serde::de::DeserializeOwned;

/// Objects per page: small enough that a page of full Nodes stays well under a MiB, large enough
/// that 1,000 Nodes are ten requests.
pub const PAGE: u32 = 100;

/// Every object `lp` selects, handed to `f` one at a time, fetched [`PAGE`] at a time. The pages
/// come from one snapshot (the API server's continue token), as a single list would.
pub async fn for_each<K>(api: &Api<K>, lp: ListParams, mut f: impl FnMut(K)) -> kube::Result<()>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let mut lp = lp.limit(PAGE);
    loop {
        let list = api.list(&lp).await?;
        list.items.into_iter().for_each(&mut f);
        match list.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return Ok(()),
        }
    }
}
