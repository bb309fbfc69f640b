//! The resources this API server serves, as [`OpenApiResource`]s.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet};
use k8s_openapi::api::authorization::v1::{
    LocalSubjectAccessReview, SelfSubjectAccessReview, SelfSubjectRulesReview, SubjectAccessReview,
};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event, Namespace, Node, Pod, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};

use super::{OpenApiResource, schema_of};

/// A core (`""` group, `v1`) resource.
const fn core(
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    subresources: &'static [&'static str],
    schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
) -> OpenApiResource {
    OpenApiResource {
        group: "",
        version: "v1",
        kind,
        plural,
        namespaced,
        subresources,
        schema,
    }
}

/// A resource of a named group at `v1` with no subresources.
const fn grouped(
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    namespaced: bool,
    schema: fn(&mut schemars::SchemaGenerator) -> schemars::Schema,
) -> OpenApiResource {
    OpenApiResource {
        group,
        version: "v1",
        kind,
        plural,
        namespaced,
        subresources: &[],
        schema,
    }
}

/// The resources the API server serves, in discovery order: core/v1 Namespace, Node, Pod,
/// Service, Endpoints, Event, ServiceAccount, ConfigMap, Secret; `coordination.k8s.io/v1`
/// Lease; `discovery.k8s.io/v1` EndpointSlice; `events.k8s.io/v1` Event;
/// `rbac.authorization.k8s.io/v1` Role, ClusterRole, RoleBinding, ClusterRoleBinding;
/// `authorization.k8s.io/v1` the four access reviews; `apps/v1` Deployment, ReplicaSet,
/// DaemonSet; `batch/v1` Job; `policy/v1` PodDisruptionBudget; `certificates.k8s.io/v1`
/// CertificateSigningRequest; `apiextensions.k8s.io/v1`
/// CustomResourceDefinition; `apiregistration.k8s.io/v1` APIService.
pub fn served_resources() -> Vec<OpenApiResource> {
    vec![
        core(
            "Namespace",
            "namespaces",
            false,
            &[],
            schema_of::<Namespace>,
        ),
        core("Node", "nodes", false, &["status"], schema_of::<Node>),
        core(
            "Pod",
            "pods",
            true,
            &["status", "binding", "eviction", "ephemeralcontainers"],
            schema_of::<Pod>,
        ),
        core(
            "Service",
            "services",
            true,
            &["status"],
            schema_of::<Service>,
        ),
        core("Endpoints", "endpoints", true, &[], schema_of::<Endpoints>),
        core("Event", "events", true, &[], schema_of::<Event>),
        core(
            "ServiceAccount",
            "serviceaccounts",
            true,
            &["token"],
            schema_of::<ServiceAccount>,
        ),
        core("ConfigMap", "configmaps", true, &[], schema_of::<ConfigMap>),
        core("Secret", "secrets", true, &[], schema_of::<Secret>),
        OpenApiResource {
            group: "coordination.k8s.io",
            version: "v1",
            kind: "Lease",
            plural: "leases",
            namespaced: true,
            subresources: &[],
            schema: schema_of::<Lease>,
        },
        OpenApiResource {
            group: "discovery.k8s.io",
            version: "v1",
            kind: "EndpointSlice",
            plural: "endpointslices",
            namespaced: true,
            subresources: &[],
            schema: schema_of::<EndpointSlice>,
        },
        OpenApiResource {
            group: "events.k8s.io",
            version: "v1",
            kind: "Event",
            plural: "events",
            namespaced: true,
            subresources: &[],
            schema: schema_of::<EventsV1Event>,
        },
        grouped(RBAC, "Role", "roles", true, schema_of::<Role>),
        grouped(
            RBAC,
            "ClusterRole",
            "clusterroles",
            false,
            schema_of::<ClusterRole>,
        ),
        grouped(
            RBAC,
            "RoleBinding",
            "rolebindings",
            true,
            schema_of::<RoleBinding>,
        ),
        grouped(
            RBAC,
            "ClusterRoleBinding",
            "clusterrolebindings",
            false,
            schema_of::<ClusterRoleBinding>,
        ),
        grouped(
            AUTHZ,
            "SubjectAccessReview",
            "subjectaccessreviews",
            false,
            schema_of::<SubjectAccessReview>,
        ),
        grouped(
            AUTHZ,
            "LocalSubjectAccessReview",
            "localsubjectaccessreviews",
            true,
            schema_of::<LocalSubjectAccessReview>,
        ),
        grouped(
            AUTHZ,
            "SelfSubjectAccessReview",
            "selfsubjectaccessreviews",
            false,
            schema_of::<SelfSubjectAccessReview>,
        ),
        grouped(
            AUTHZ,
            "SelfSubjectRulesReview",
            "selfsubjectrulesreviews",
            false,
            schema_of::<SelfSubjectRulesReview>,
        ),
        OpenApiResource {
            group: "apps",
            version: "v1",
            kind: "Deployment",
            plural: "deployments",
            namespaced: true,
            subresources: &["status", "scale"],
            schema: schema_of::<Deployment>,
        },
        OpenApiResource {
            group: "apps",
            version: "v1",
            kind: "ReplicaSet",
            plural: "replicasets",
            namespaced: true,
            subresources: &["status", "scale"],
            schema: schema_of::<ReplicaSet>,
        },
        OpenApiResource {
            group: "apps",
            version: "v1",
            kind: "DaemonSet",
            plural: "daemonsets",
            namespaced: true,
            subresources: &["status"],
            schema: schema_of::<DaemonSet>,
        },
        OpenApiResource {
            group: "batch",
            version: "v1",
            kind: "Job",
            plural: "jobs",
            namespaced: true,
            subresources: &["status"],
            schema: schema_of::<Job>,
        },
        OpenApiResource {
            group: "policy",
            version: "v1",
            kind: "PodDisruptionBudget",
            plural: "poddisruptionbudgets",
            namespaced: true,
            subresources: &["status"],
            schema: schema_of::<PodDisruptionBudget>,
        },
        OpenApiResource {
            group: "certificates.k8s.io",
            version: "v1",
            kind: "CertificateSigningRequest",
            plural: "certificatesigningrequests",
            namespaced: false,
            subresources: &["status", "approval"],
            schema: schema_of::<k8s_openapi::api::certificates::v1::CertificateSigningRequest>,
        },
        OpenApiResource {
            group: "apiextensions.k8s.io",
            version: "v1",
            kind: "CustomResourceDefinition",
            plural: "customresourcedefinitions",
            namespaced: false,
            subresources: &["status"],
            schema: schema_of::<
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
            >,
        },
        OpenApiResource {
            group: "apiregistration.k8s.io",
            version: "v1",
            kind: "APIService",
            plural: "apiservices",
            namespaced: false,
            subresources: &["status"],
            schema: schema_of::<k8s_openapi::kube_aggregator::pkg::apis::apiregistration::v1::APIService>,
        },
    ]
}

const RBAC: &str = crate::registry::authorization::RBAC_GROUP;
const AUTHZ: &str = crate::registry::authorization::AUTHORIZATION_GROUP;
