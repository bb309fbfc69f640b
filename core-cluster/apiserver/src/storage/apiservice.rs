//! kube-aggregator's autoregister controller, in-process
//! (`staging/src/k8s.io/kube-aggregator/pkg/controllers/autoregister`): one Local
//! APIService per served group-version, created when the group-version is served (at
//! startup, and when a custom resource definition is established) and deleted when it no
//! longer is. Only the APIServices it made (label
//! `kube-aggregator.kubernetes.io/automanaged`) are ever deleted.

use super::{
    ObjectKey, Storage, WriteContext,
    create::create_object,
    delete::{DeleteOptions, delete_object},
    get_list::list_all,
};
use crate::registry::{ResourceDef, meta::str_at};

const AUTOMANAGED: &str = "kube-aggregator.kubernetes.io/automanaged";

fn def() -> &'static ResourceDef {
    &crate::apiservice::API_SERVICES
}

/// Brings the APIServices in line with what `storage` serves.
pub(crate) async fn sync(storage: &Storage) {
    let Ok(existing) = list_all(&*storage.store, def(), None).await else {
        return;
    };
    let served = storage.registry.group_versions();
    let name_of = |(g, v): &(&str, &str)| {
        if g.is_empty() {
            (*v).to_owned()
        } else {
            format!("{v}.{g}")
        }
    };
    let wanted: Vec<String> = served.iter().map(name_of).collect();
    let have: Vec<&str> = existing
        .iter()
        .filter_map(|o| str_at(o, &["metadata", "name"]))
        .collect();
    let ctx = WriteContext::server();
    let now = crate::registry::meta::now_rfc3339();
    for (gv, name) in served.iter().zip(&wanted) {
        if have.contains(&name.as_str()) {
            continue;
        }
        let obj = crate::apiservice::local(gv.0, gv.1, &now);
        if let Err(e) = create_object(storage, &ctx, def(), None, obj).await
            && e.reason != "AlreadyExists"
        {
            tracing::warn!(apiservice = %name, error = %e, "registering a Local APIService failed");
        }
    }
    for obj in &existing {
        let name = str_at(obj, &["metadata", "name"]).unwrap_or("");
        let automanaged = !obj["metadata"]["labels"][AUTOMANAGED].is_null();
        if automanaged && !wanted.iter().any(|w| w == name) {
            let key = ObjectKey::new(def(), None, name);
            let _ = delete_object(storage, &ctx, key, DeleteOptions::default()).await;
        }
    }
}
