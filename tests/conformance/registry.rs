//! Providers are found by name once linked (upstream-cloud-provider.md §1.4, checklist rows 1–4).

use cloud_provider::{Registry, RegistryError, init_cloud_provider};

#[test]
fn every_linked_provider_is_registered_by_name() {
    let registry = Registry::global().unwrap();
    assert_eq!(registry.names(), ["fake", "hello"]);
}

#[test]
fn row2_unknown_names_list_what_is_linked() {
    let err = init_cloud_provider("gce", None).err().unwrap();
    assert!(matches!(err, RegistryError::UnknownProvider { .. }));
    assert_eq!(
        err.to_string(),
        "unknown cloud provider \"gce\"; registered providers: fake, hello"
    );
}

#[test]
fn row3_external_and_empty_build_nothing() {
    assert!(init_cloud_provider("external", None).unwrap().is_none());
    assert!(init_cloud_provider("", None).unwrap().is_none());
}

#[test]
fn row4_no_config_flag_gives_the_factory_none() {
    // The fake without a config is an empty cloud; hello without a config has no instances.
    let fake = init_cloud_provider("fake", None).unwrap().unwrap();
    assert_eq!(fake.provider_name(), "fake");
    let hello = init_cloud_provider("hello", None).unwrap().unwrap();
    assert_eq!(hello.provider_name(), "hello");
}
