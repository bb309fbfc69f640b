//! The node simulator configured per node from a simulator config file in
//! KubeletConfiguration's shape, against the in-process API server with paused tokio time:
//! swap (`pkg/kubelet/cm/container_manager_linux.go` `validateSwapConfiguration`,
//! `pkg/kubelet/nodestatus/setters.go` `MachineInfo`,
//! `pkg/kubelet/kuberuntime/kuberuntime_container_linux.go` `calcSwapForBurstablePods`) and
//! the TopologyManager (`pkg/kubelet/cm/topologymanager/topology_manager.go` `Admit`,
//! `policy_single_numa_node.go`).

use std::{sync::Arc, time::Duration};

use ccm_testkit::eventually;
use core_cluster::{
    ApiServer, ApiServerConfig,
    sim::{
        CGROUP_V1_REASON, CGROUP_V1_WARNING, FAIL_SWAP_ON_MESSAGE, NodeConfigFile, NodeSimulator,
        SWAP_LIMIT_ANNOTATION, SimConfig, SimNode, TOPOLOGY_AFFINITY_ERROR,
    },
    store::MemoryStore,
};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::{
    Api, Client, ResourceExt,
    api::{ListParams, PostParams},
};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const FILE: &str = r#"
apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
machine: {cpu: "8", memory: 16Gi}
nodes:
  - name: swapper
    machine: {swap: 4Gi}
    kubelet:
      failSwapOn: false
      memorySwap: {swapBehavior: LimitedSwap}
      registerWithTaints: [{key: swap, value: "on", effect: PreferNoSchedule}]
  - name: refuses-swap
    machine: {swap: 2Gi}
  - name: numa
    machine: {numaNodes: 2}
    kubelet:
      cpuManagerPolicy: static
      topologyManagerPolicy: single-numa-node
  - name: numa-best-effort
    machine: {numaNodes: 2}
    kubelet:
      cpuManagerPolicy: static
      topologyManagerPolicy: best-effort
"#;

async fn start() -> (Client, NodeSimulator, CancellationToken) {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let file = NodeConfigFile::parse(FILE).unwrap();
    let (config, nodes) = file
        .apply(&SimConfig::default(), vec![SimNode::new("plain")])
        .unwrap();
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(nodes);
    let stop = CancellationToken::new();
    tokio::spawn({
        let (sim, stop) = (sim.clone(), stop.clone());
        async move { sim.run(stop).await.unwrap() }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(30, "four nodes registered", || async {
        (nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 4)
            .then_some(())
    })
    .await;
    (client, sim, stop)
}

fn pod(name: &str, node: &str, resources: serde_json::Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "nginx", "resources": resources}]},
    }))
    .unwrap()
}

fn swap_capacity(n: &Node) -> Option<i64> {
    n.status
        .as_ref()?
        .node_info
        .as_ref()?
        .swap
        .as_ref()?
        .capacity
}

/// `validateSwapConfiguration`: the node whose machine has swap under the default
/// `failSwapOn: true` never registers, with kubelet's error; the others register with their
/// own machine's swap in `status.nodeInfo.swap.capacity` (`MachineInfo`, absent without
/// swap) and their own `registerWithTaints`; a Burstable pod on the LimitedSwap node gets
/// `calcSwapForBurstablePods`' limit (1Gi / 16Gi × 4Gi = 256Mi), a Guaranteed one none.
#[tokio::test(start_paused = true)]
async fn each_node_follows_its_own_swap_configuration_from_the_file() {
    let (client, sim, stop) = start().await;
    let _guard = stop.drop_guard();
    let nodes: Api<Node> = Api::all(client.clone());
    tokio::time::sleep(Duration::from_secs(30)).await;
    let names: Vec<String> = nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| n.name_any())
        .collect();
    assert!(!names.contains(&"refuses-swap".to_owned()), "{names:?}");
    assert_eq!(
        sim.startup_error("refuses-swap").unwrap().as_deref(),
        Some(FAIL_SWAP_ON_MESSAGE)
    );
    assert_eq!(sim.startup_error("swapper").unwrap(), None);

    let swapper = nodes.get("swapper").await.unwrap();
    assert_eq!(swap_capacity(&swapper), Some(4 << 30));
    let taints = swapper.spec.unwrap().taints.unwrap();
    assert_eq!(
        (taints[0].key.as_str(), taints[0].effect.as_str()),
        ("swap", "PreferNoSchedule")
    );
    let plain = nodes.get("plain").await.unwrap();
    // `nodestatus/setters.go` `MachineInfo`: `nodeInfo.swap` is set only when the machine
    // has swap (`info.SwapCapacity != 0`); kube-apiserver refuses a capacity of 0.
    assert_eq!(swap_capacity(&plain), None);
    assert_eq!(plain.status.unwrap().capacity.unwrap()["cpu"].0, "8");

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    pods.create(
        &PostParams::default(),
        &pod(
            "burstable",
            "swapper",
            json!({"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}}),
        ),
    )
    .await
    .unwrap();
    pods.create(
        &PostParams::default(),
        &pod(
            "guaranteed",
            "swapper",
            json!({"limits": {"cpu": "1", "memory": "1Gi"}}),
        ),
    )
    .await
    .unwrap();
    let annotation = eventually(30, "the swap limit on the pod", || async {
        pods.get("burstable")
            .await
            .unwrap()
            .annotations()
            .get(SWAP_LIMIT_ANNOTATION)
            .cloned()
    })
    .await;
    assert_eq!(annotation, r#"{"c":"268435456"}"#);
    eventually(30, "guaranteed running", || async {
        let p = pods.get("guaranteed").await.unwrap();
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert!(
        !pods
            .get("guaranteed")
            .await
            .unwrap()
            .annotations()
            .contains_key(SWAP_LIMIT_ANNOTATION)
    );
}

/// `topology_manager.go` `Admit` under `single-numa-node` (`policy_single_numa_node.go`,
/// with the static CPU manager's hints): on 8 CPUs in 2 NUMA nodes, a Guaranteed pod of 3
/// CPUs runs; one of 6 CPUs fits no single NUMA node and fails admission (phase Failed,
/// reason `TopologyAffinityError`, kubelet's rejectPod message and Warning Event); a
/// Burstable pod asks for no alignment and runs; under `best-effort` the 6-CPU pod runs.
#[tokio::test(start_paused = true)]
async fn single_numa_node_refuses_a_guaranteed_pod_no_numa_node_can_hold() {
    let (client, sim, stop) = start().await;
    let _guard = stop.drop_guard();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let guaranteed = |cpu: &str| json!({"limits": {"cpu": cpu, "memory": "1Gi"}});
    for p in [
        pod("fits", "numa", guaranteed("3")),
        pod("big", "numa", guaranteed("6")),
        pod("burstable", "numa", json!({"requests": {"cpu": "7"}})),
        pod("big-best-effort", "numa-best-effort", guaranteed("6")),
    ] {
        pods.create(&PostParams::default(), &p).await.unwrap();
    }
    let phase = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.unwrap();
            let s = p.status.unwrap_or_default();
            (s.phase.unwrap_or_default(), s.reason, s.message)
        }
    };
    eventually(30, "pods admitted or refused", || async {
        let done = ["fits", "big", "burstable", "big-best-effort"];
        for name in done {
            if phase(name).await.0.is_empty() || phase(name).await.0 == "Pending" {
                return None;
            }
        }
        Some(())
    })
    .await;
    assert_eq!(phase("fits").await.0, "Running");
    assert_eq!(phase("burstable").await.0, "Running");
    assert_eq!(phase("big-best-effort").await.0, "Running");
    let (p, reason, message) = phase("big").await;
    assert_eq!(p, "Failed");
    assert_eq!(reason.as_deref(), Some(TOPOLOGY_AFFINITY_ERROR));
    assert_eq!(
        message.as_deref(),
        Some("Pod was rejected: Resources cannot be allocated with Topology locality")
    );
    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let event = eventually(10, "the Warning event", || async {
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(TOPOLOGY_AFFINITY_ERROR))
    })
    .await;
    assert_eq!(event.involved_object.name.as_deref(), Some("big"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    // 3 CPUs held on one NUMA node, nothing for the refused or Burstable pods.
    let free: Vec<i64> = sim.numa_free("numa").unwrap().iter().map(|f| f.0).collect();
    assert_eq!(free, [1000, 4000]);
    pods.delete("fits", &Default::default()).await.unwrap();
    eventually(30, "the NUMA node given back", || async {
        let free: Vec<i64> = sim.numa_free("numa").ok()?.iter().map(|f| f.0).collect();
        (free == [4000, 4000]).then_some(())
    })
    .await;
}

const SWAP_GATES: &str = r#"
apiVersion: sim.ccm-rs.io/v1alpha1
kind: NodeSimulatorConfiguration
machine: {cpu: "8", memory: 16Gi, swap: 4Gi}
kubelet: {failSwapOn: false}
nodes:
  - name: limited
    kubelet:
      memorySwap: {swapBehavior: LimitedSwap}
  - name: gate-off
    kubelet:
      featureGates: {NodeSwap: false}
  - name: cgroup-v1
    machine: {cgroupVersion: 1}
    kubelet:
      memorySwap: {swapBehavior: LimitedSwap}
"#;

/// What kubelet 1.32 does with swap at startup, per node: with the `NodeSwap` feature gate
/// off it reports no `nodeInfo.swap` (`nodestatus/setters.go` `MachineInfo`) and gives every
/// container NoSwap; on a cgroup v1 machine LimitedSwap is NoSwap
/// (`kuberuntime_container_linux.go` `GetContainerSwapBehavior`) and kubelet posts its
/// `CgroupV1` Warning Event (`kubelet.go` `warnCgroupV1Usage`); on cgroup v2 with the gate on
/// a Burstable pod gets its `calcSwapForBurstablePods` share (1Gi / 16Gi × 4Gi = 256Mi).
#[tokio::test(start_paused = true)]
async fn the_node_swap_gate_and_cgroup_v1_leave_containers_without_swap() {
    let server = ApiServer::new(Arc::new(MemoryStore::new()), ApiServerConfig::default())
        .await
        .unwrap();
    let client = Client::new(server.router(), "default");
    let (config, nodes) = NodeConfigFile::parse(SWAP_GATES)
        .unwrap()
        .apply(&SimConfig::default(), vec![])
        .unwrap();
    let sim = NodeSimulator::new(client.clone(), config);
    sim.add_nodes(nodes);
    let stop = CancellationToken::new();
    let _guard = stop.clone().drop_guard();
    tokio::spawn({
        let sim = sim.clone();
        async move { sim.run(stop).await.unwrap() }
    });
    let nodes: Api<Node> = Api::all(client.clone());
    eventually(30, "three nodes registered", || async {
        (nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len()
            == 3)
            .then_some(())
    })
    .await;
    assert_eq!(
        swap_capacity(&nodes.get("limited").await.unwrap()),
        Some(4 << 30)
    );
    let gate_off = nodes.get("gate-off").await.unwrap();
    assert!(
        gate_off.status.unwrap().node_info.unwrap().swap.is_none(),
        "no nodeInfo.swap without the NodeSwap gate"
    );
    assert_eq!(
        swap_capacity(&nodes.get("cgroup-v1").await.unwrap()),
        Some(4 << 30)
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let burstable = json!({"requests": {"memory": "1Gi"}, "limits": {"memory": "2Gi"}});
    for node in ["limited", "gate-off", "cgroup-v1"] {
        pods.create(&PostParams::default(), &pod(node, node, burstable.clone()))
            .await
            .unwrap();
    }
    for node in ["limited", "gate-off", "cgroup-v1"] {
        eventually(30, "the pod running", || async {
            let p = pods.get(node).await.unwrap();
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    }
    let limit = |name: &'static str| {
        let pods = pods.clone();
        async move {
            pods.get(name)
                .await
                .unwrap()
                .annotations()
                .get(SWAP_LIMIT_ANNOTATION)
                .cloned()
        }
    };
    assert_eq!(
        limit("limited").await.as_deref(),
        Some(r#"{"c":"268435456"}"#)
    );
    assert_eq!(limit("gate-off").await, None, "NoSwap without the gate");
    assert_eq!(limit("cgroup-v1").await, None, "NoSwap on cgroup v1");

    let events: Api<Event> = Api::namespaced(client.clone(), "default");
    let warned = eventually(10, "the CgroupV1 Event", || async {
        let found: Vec<Event> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(CGROUP_V1_REASON))
            .collect();
        (!found.is_empty()).then_some(found)
    })
    .await;
    assert_eq!(warned.len(), 1, "only the cgroup v1 node warns");
    let event = &warned[0];
    assert_eq!(event.involved_object.name.as_deref(), Some("cgroup-v1"));
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.message.as_deref(), Some(CGROUP_V1_WARNING));
}
