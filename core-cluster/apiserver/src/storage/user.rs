//! Who is asking (upstream's `k8s.io/apiserver/pkg/authentication/user`): the identity
//! authentication gives a request, which authorization and admission read. Re-exported as
//! [`crate::auth::UserInfo`].

use std::collections::BTreeMap;

/// The group every authenticated user is in.
pub const GROUP_AUTHENTICATED: &str = "system:authenticated";
/// The group of anonymous requests.
pub const GROUP_UNAUTHENTICATED: &str = "system:unauthenticated";
/// The superuser group: every request from it is authorized.
pub const GROUP_MASTERS: &str = "system:masters";
/// The user name of anonymous requests.
pub const USER_ANONYMOUS: &str = "system:anonymous";
/// The group of every node (kubelet) identity.
pub const GROUP_NODES: &str = "system:nodes";
/// The prefix of a node's user name: `system:node:<node name>`.
pub const NODE_USER_PREFIX: &str = "system:node:";

/// An authenticated identity: user name, UID, groups and extra attributes
/// (`k8s.io/apiserver/pkg/authentication/user.Info`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UserInfo {
    /// The user name (`CN` of a client certificate, `system:serviceaccount:<ns>:<name>`…).
    pub name: String,
    /// A unique ID, when the authenticator has one (service accounts do).
    pub uid: String,
    /// The groups (`O` of a client certificate, `system:authenticated`…).
    pub groups: Vec<String>,
    /// Extra attributes (a bound service-account token's pod name, …).
    pub extra: BTreeMap<String, Vec<String>>,
}

impl UserInfo {
    /// A user with `name` in `groups`; `system:authenticated` is added if missing.
    ///
    /// ```
    /// use core_cluster_apiserver::auth::UserInfo;
    /// let alice = UserInfo::new("alice", ["dev"]);
    /// assert_eq!(alice.groups, ["dev", "system:authenticated"]);
    /// ```
    pub fn new<G: Into<String>>(
        name: impl Into<String>,
        groups: impl IntoIterator<Item = G>,
    ) -> Self {
        let mut groups: Vec<String> = groups.into_iter().map(Into::into).collect();
        if !groups.iter().any(|g| g == GROUP_AUTHENTICATED) {
            groups.push(GROUP_AUTHENTICATED.to_owned());
        }
        UserInfo {
            name: name.into(),
            groups,
            ..UserInfo::default()
        }
    }

    /// The anonymous user: `system:anonymous` in `system:unauthenticated`.
    pub fn anonymous() -> Self {
        UserInfo {
            name: USER_ANONYMOUS.to_owned(),
            groups: vec![GROUP_UNAUTHENTICATED.to_owned()],
            ..UserInfo::default()
        }
    }

    /// The in-process loopback client: `system:apiserver` in `system:masters`.
    pub fn loopback() -> Self {
        UserInfo::new("system:apiserver", [GROUP_MASTERS])
    }

    /// Whether the user is in `group`.
    pub fn in_group(&self, group: &str) -> bool {
        self.groups.iter().any(|g| g == group)
    }

    /// The node name of a node identity (`system:node:<name>` in `system:nodes`).
    pub fn node_name(&self) -> Option<&str> {
        self.name
            .strip_prefix(NODE_USER_PREFIX)
            .filter(|n| !n.is_empty() && self.in_group(GROUP_NODES))
    }
}
