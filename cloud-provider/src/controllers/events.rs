//! Writing core/v1 Events about the objects a controller manages.

use jiff::Timestamp;
use k8s_openapi::api::core::v1::{Event, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::api::PostParams;
use kube::{Api, Resource, ResourceExt};

/// `Normal` or `Warning`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    Normal,
    Warning,
}

/// Records an event about `obj`; failures are logged, never returned (events are best effort).
pub(crate) async fn record<K>(
    client: &kube::Client,
    component: &str,
    obj: &K,
    type_: EventType,
    reason: &str,
    message: &str,
) where
    K: Resource<DynamicType = ()>,
{
    let namespace = obj.namespace().unwrap_or_else(|| "default".to_owned());
    let now = Timestamp::now();
    let name = obj.name_any();
    let event = Event {
        metadata: ObjectMeta {
            generate_name: Some(format!("{name}.")),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        involved_object: ObjectReference {
            api_version: Some(K::api_version(&()).into_owned()),
            kind: Some(K::kind(&()).into_owned()),
            name: Some(name),
            namespace: obj.namespace(),
            uid: obj.uid(),
            resource_version: obj.resource_version(),
            ..Default::default()
        },
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        type_: Some(
            match type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        source: Some(EventSource {
            component: Some(component.to_owned()),
            host: None,
        }),
        first_timestamp: Some(Time(now)),
        last_timestamp: Some(Time(now)),
        event_time: Some(MicroTime(now)),
        reporting_component: Some(component.to_owned()),
        reporting_instance: Some(component.to_owned()),
        action: Some(reason.to_owned()),
        count: Some(1),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), &namespace);
    if let Err(err) = api.create(&PostParams::default(), &event).await {
        tracing::warn!(%err, reason, "failed to record event");
    }
}
