//! Service allocation as kube-apiserver does it: a ClusterIP from `--service-cluster-ip-range`,
//! NodePorts from `--service-node-port-range` for NodePort and LoadBalancer Services, and a
//! `healthCheckNodePort` for LoadBalancer Services with `externalTrafficPolicy: Local`.
//! Never two alike; released on delete.
//!
//! The allocator itself does no I/O. The API server keeps its state in the store as
//! upstream's RangeAllocation objects (`pkg/registry/core/service/allocator/storage`): one
//! bitmap per range ([`ServiceAllocator::snapshot`], [`ServiceAllocator::restore`]), changed
//! under compare-and-swap, so that API servers sharing a store never hand out one IP or port
//! twice. [`Repair`] is upstream's repair loop (`ipallocator/controller/repair.go`,
//! `portallocator/controller/repair.go`) as a pure function of the stored bitmaps and the
//! stored Services.

use std::{
    collections::{HashMap, HashSet},
    net::IpAddr,
    ops::RangeInclusive,
};

use base64::Engine as _;
use ipnet::IpNet;
use serde_json::{Value, json};

use crate::registry::FieldError;

/// What one write allocated (to roll back if the write fails) and what it gave up (to
/// release once the write succeeds).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Allocation {
    /// Newly taken IPs.
    pub ips: Vec<IpAddr>,
    /// Newly taken ports.
    pub ports: Vec<u16>,
    /// IPs the old object had and the new one does not.
    pub released_ips: Vec<IpAddr>,
    /// Ports the old object had and the new one does not.
    pub released_ports: Vec<u16>,
}

/// The most addresses one Service CIDR allocates from: kube-apiserver refuses a
/// `--service-cluster-ip-range` with more than 20 host bits (`cmd/kube-apiserver/app/options/
/// validation.go` `validateClusterIPFlags`), and the bitmap covers no more.
pub const MAX_RANGE_ADDRESSES: u128 = 1 << 20;

/// One thing a Service holds: a ClusterIP or a NodePort (health check ports included).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Item {
    /// A ClusterIP.
    Ip(IpAddr),
    /// A NodePort.
    Port(u16),
}

impl std::fmt::Display for Item {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Item::Ip(ip) => write!(f, "ClusterIP {ip}"),
            Item::Port(port) => write!(f, "NodePort {port}"),
        }
    }
}

/// Which stored bitmap an [`Item`] lives in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RangeId {
    /// The IPs of the `n`th Service CIDR (0: `serviceips`, 1: `secondaryserviceips`).
    Ips(usize),
    /// The NodePorts (`servicenodeports`).
    Ports,
}

impl RangeId {
    /// The name of its RangeAllocation under `/registry/ranges/`, as kube-apiserver names
    /// them (`pkg/registry/core/rest/storage_core.go`).
    pub fn name(self) -> &'static str {
        match self {
            RangeId::Ips(0) => "serviceips",
            RangeId::Ips(_) => "secondaryserviceips",
            RangeId::Ports => "servicenodeports",
        }
    }
}

/// A RangeAllocation object (`api/core/v1` RangeAllocation): the range it covers and the
/// bitmap of allocated offsets, a big-endian integer whose bit `n` is offset `n`, as
/// upstream's `allocator.AllocationBitmap.Snapshot` writes it (`big.Int.Bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RangeSnapshot {
    /// The range: a CIDR, or `first-last` for ports.
    pub range: String,
    /// The bitmap.
    pub data: Vec<u8>,
}

/// A stored RangeAllocation that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("unreadable RangeAllocation: {0}")]
pub struct RangeDecodeError(String);

impl RangeSnapshot {
    /// The object as stored (JSON, `data` in base64 as the API encodes bytes).
    pub fn to_json(&self) -> Value {
        json!({
            "apiVersion": "v1",
            "kind": "RangeAllocation",
            "metadata": {},
            "range": self.range,
            "data": base64::engine::general_purpose::STANDARD.encode(&self.data),
        })
    }

    /// Reads a stored object.
    pub fn from_json(bytes: &[u8]) -> Result<Self, RangeDecodeError> {
        let value: Value =
            serde_json::from_slice(bytes).map_err(|e| RangeDecodeError(e.to_string()))?;
        let range = value["range"]
            .as_str()
            .ok_or_else(|| RangeDecodeError("no range".into()))?
            .to_owned();
        let data = base64::engine::general_purpose::STANDARD
            .decode(value["data"].as_str().unwrap_or(""))
            .map_err(|e| RangeDecodeError(e.to_string()))?;
        Ok(RangeSnapshot { range, data })
    }
}

/// Sets bit `offset` of a big-endian bitmap.
fn bitmap_from_offsets(offsets: impl Iterator<Item = u128>) -> Vec<u8> {
    let offsets: Vec<u128> = offsets.collect();
    let Some(max) = offsets.iter().max() else {
        return Vec::new();
    };
    let len = usize::try_from(max / 8 + 1).unwrap_or(0);
    let mut data = vec![0u8; len];
    for offset in offsets {
        let byte = usize::try_from(offset / 8).unwrap_or(0);
        data[len - 1 - byte] |= 1 << (offset % 8);
    }
    data
}

/// The offsets set in a big-endian bitmap.
fn offsets_of_bitmap(data: &[u8]) -> impl Iterator<Item = u128> + '_ {
    data.iter().rev().enumerate().flat_map(|(byte, bits)| {
        (0..8u128)
            .filter(move |bit| bits & (1 << bit) != 0)
            .map(move |bit| byte as u128 * 8 + bit)
    })
}

/// The ClusterIP and NodePort allocator.
#[derive(Debug, Clone)]
pub struct ServiceAllocator {
    ranges: Vec<IpNet>,
    used_ips: HashSet<IpAddr>,
    ip_cursor: Vec<u128>,
    ports: RangeInclusive<u16>,
    used_ports: HashSet<u16>,
    port_cursor: u16,
}

fn ip_to_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u32::from(v4) as u128,
        IpAddr::V6(v6) => u128::from(v6),
    }
}

fn u128_to_ip(v: u128, v6: bool) -> IpAddr {
    if v6 {
        IpAddr::V6(v.into())
    } else {
        IpAddr::V4((v as u32).into())
    }
}

fn family(ip: &IpAddr) -> &'static str {
    if ip.is_ipv6() { "IPv6" } else { "IPv4" }
}

fn wants_node_ports(spec: &Value) -> bool {
    match spec
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("ClusterIP")
    {
        "NodePort" => true,
        "LoadBalancer" => {
            spec.get("allocateLoadBalancerNodePorts")
                .and_then(Value::as_bool)
                != Some(false)
        }
        _ => false,
    }
}

fn wants_health_check_port(spec: &Value) -> bool {
    spec.get("type").and_then(Value::as_str) == Some("LoadBalancer")
        && spec.get("externalTrafficPolicy").and_then(Value::as_str) == Some("Local")
}

fn cluster_ips(spec: &Value) -> Vec<IpAddr> {
    spec.get("clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default()
}

/// Everything a stored Service holds: its ClusterIPs and NodePorts.
pub fn service_items(service: &Value) -> Vec<Item> {
    let spec = &service["spec"];
    cluster_ips(spec)
        .into_iter()
        .map(Item::Ip)
        .chain(node_ports(spec).into_iter().map(Item::Port))
        .collect()
}

fn node_ports(spec: &Value) -> Vec<u16> {
    let mut ports: Vec<u16> = spec
        .get("ports")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|p| p.get("nodePort")?.as_u64())
                .filter_map(|p| u16::try_from(p).ok())
                .collect()
        })
        .unwrap_or_default();
    if let Some(hc) = spec.get("healthCheckNodePort").and_then(Value::as_u64) {
        ports.extend(u16::try_from(hc).ok());
    }
    ports
}

impl ServiceAllocator {
    /// An allocator over the Service CIDRs (one, or one per family) and the NodePort range.
    pub fn new(ranges: Vec<IpNet>, ports: RangeInclusive<u16>) -> Self {
        let ip_cursor = ranges.iter().map(|r| ip_to_u128(r.network()) + 1).collect();
        let start = *ports.start();
        ServiceAllocator {
            ranges,
            used_ips: HashSet::new(),
            ip_cursor,
            ports,
            used_ports: HashSet::new(),
            port_cursor: start,
        }
    }

    /// The first usable IP of the first range: the `kubernetes` Service's ClusterIP.
    pub fn first_ip(&self) -> Option<IpAddr> {
        self.ranges
            .first()
            .map(|r| u128_to_ip(ip_to_u128(r.network()) + 1, r.addr().is_ipv6()))
    }

    /// The first and last allocatable address of IP range `index` as numbers: the network
    /// and (IPv4) broadcast addresses are never handed out, and at most
    /// [`MAX_RANGE_ADDRESSES`] are.
    fn bounds(&self, index: usize) -> Option<(u128, u128)> {
        let range = self.ranges.get(index)?;
        let v6 = range.addr().is_ipv6();
        let first = ip_to_u128(range.network()) + 1;
        let last = ip_to_u128(range.broadcast())
            .saturating_sub(if v6 { 0 } else { 1 })
            .min(first + MAX_RANGE_ADDRESSES - 1);
        (last >= first).then_some((first, last))
    }

    /// Which range `item` belongs to, or `None` when it is outside every range.
    pub fn range_of(&self, item: Item) -> Option<RangeId> {
        match item {
            Item::Ip(ip) => {
                let n = ip_to_u128(ip);
                (0..self.ranges.len())
                    .find(|&i| {
                        self.ranges[i].addr().is_ipv6() == ip.is_ipv6()
                            && self.bounds(i).is_some_and(|(f, l)| (f..=l).contains(&n))
                    })
                    .map(RangeId::Ips)
            }
            Item::Port(port) => self.ports.contains(&port).then_some(RangeId::Ports),
        }
    }

    /// Every range this allocator keeps a bitmap for.
    pub fn range_ids(&self) -> Vec<RangeId> {
        (0..self.ranges.len())
            .map(RangeId::Ips)
            .chain([RangeId::Ports])
            .collect()
    }

    /// The RangeAllocation of `id`: its range and the bitmap of what is used in it.
    pub fn snapshot(&self, id: RangeId) -> RangeSnapshot {
        match id {
            RangeId::Ips(i) => {
                let first = self.bounds(i).map_or(0, |(f, _)| f);
                RangeSnapshot {
                    range: self
                        .ranges
                        .get(i)
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                    data: bitmap_from_offsets(
                        self.used_ips
                            .iter()
                            .filter(|ip| self.range_of(Item::Ip(**ip)) == Some(id))
                            .map(|ip| ip_to_u128(*ip) - first),
                    ),
                }
            }
            RangeId::Ports => RangeSnapshot {
                range: format!("{}-{}", self.ports.start(), self.ports.end()),
                data: bitmap_from_offsets(
                    self.used_ports
                        .iter()
                        .filter(|p| self.ports.contains(p))
                        .map(|p| u128::from(*p - self.ports.start())),
                ),
            },
        }
    }

    /// Replaces what is used in range `id` by a stored RangeAllocation. A snapshot of another
    /// range (the flags changed) restores nothing and returns `false`: the repair rebuilds it
    /// from the Services, as upstream's repair does on `ErrMismatchedNetwork`.
    pub fn restore(&mut self, id: RangeId, snapshot: &RangeSnapshot) -> bool {
        let mine = self.snapshot(id).range;
        let items: Vec<Item> = self.items().into_iter().collect();
        for item in items {
            if self.range_of(item) == Some(id) {
                self.unmark(item);
            }
        }
        if snapshot.range != mine {
            return false;
        }
        match id {
            RangeId::Ips(i) => {
                let Some((first, last)) = self.bounds(i) else {
                    return true;
                };
                let v6 = self.ranges[i].addr().is_ipv6();
                for offset in offsets_of_bitmap(&snapshot.data) {
                    if first + offset <= last {
                        self.used_ips.insert(u128_to_ip(first + offset, v6));
                    }
                }
            }
            RangeId::Ports => {
                let start = *self.ports.start();
                for offset in offsets_of_bitmap(&snapshot.data) {
                    if let Some(port) = u16::try_from(offset)
                        .ok()
                        .and_then(|o| start.checked_add(o))
                        .filter(|p| self.ports.contains(p))
                    {
                        self.used_ports.insert(port);
                    }
                }
            }
        }
        true
    }

    /// Everything in use.
    pub fn items(&self) -> HashSet<Item> {
        self.used_ips
            .iter()
            .map(|ip| Item::Ip(*ip))
            .chain(self.used_ports.iter().map(|p| Item::Port(*p)))
            .collect()
    }

    /// Marks `item` used; `false` if it already was.
    pub fn mark(&mut self, item: Item) -> bool {
        match item {
            Item::Ip(ip) => self.used_ips.insert(ip),
            Item::Port(port) => self.used_ports.insert(port),
        }
    }

    /// Marks `item` free.
    pub fn unmark(&mut self, item: Item) {
        match item {
            Item::Ip(ip) => self.used_ips.remove(&ip),
            Item::Port(port) => self.used_ports.remove(&port),
        };
    }

    /// Marks a stored Service's IPs and ports as used (startup recovery).
    pub fn recover(&mut self, service: &Value) {
        let spec = &service["spec"];
        self.used_ips.extend(cluster_ips(spec));
        self.used_ports.extend(node_ports(spec));
    }

    /// Gives back a deleted Service's IPs and ports.
    pub fn release(&mut self, service: &Value) {
        let spec = &service["spec"];
        for ip in cluster_ips(spec) {
            self.used_ips.remove(&ip);
        }
        for port in node_ports(spec) {
            self.used_ports.remove(&port);
        }
    }

    /// Undoes `allocation` after a failed write.
    pub fn rollback(&mut self, allocation: &Allocation) {
        for ip in &allocation.ips {
            self.used_ips.remove(ip);
        }
        for port in &allocation.ports {
            self.used_ports.remove(port);
        }
    }

    /// Frees what the old object had after a successful write.
    pub fn commit(&mut self, allocation: &Allocation) {
        for ip in &allocation.released_ips {
            self.used_ips.remove(ip);
        }
        for port in &allocation.released_ports {
            self.used_ports.remove(port);
        }
    }

    fn take_ip(&mut self, range_index: usize) -> Option<IpAddr> {
        let v6 = self.ranges[range_index].addr().is_ipv6();
        let (first, last) = self.bounds(range_index)?;
        let size = last - first + 1;
        let mut candidate = self.ip_cursor[range_index].clamp(first, last);
        for _ in 0..size.min(1 << 24) {
            let ip = u128_to_ip(candidate, v6);
            candidate = if candidate >= last {
                first
            } else {
                candidate + 1
            };
            if self.used_ips.insert(ip) {
                self.ip_cursor[range_index] = candidate;
                return Some(ip);
            }
        }
        None
    }

    fn take_port(&mut self) -> Option<u16> {
        let (start, end) = (*self.ports.start(), *self.ports.end());
        let mut candidate = self.port_cursor.clamp(start, end);
        for _ in start..=end {
            let port = candidate;
            candidate = if candidate >= end {
                start
            } else {
                candidate + 1
            };
            if self.used_ports.insert(port) {
                self.port_cursor = candidate;
                return Some(port);
            }
        }
        None
    }

    /// Fills `spec.clusterIP(s)`, `spec.ipFamilies` and the node ports of a Service being
    /// created (`old == None`) or updated, validating the ones the user chose.
    pub fn allocate(
        &mut self,
        service: &mut Value,
        old: Option<&Value>,
    ) -> Result<Allocation, Vec<FieldError>> {
        let mut alloc = Allocation::default();
        let result = self.allocate_inner(service, old, &mut alloc);
        if result.is_err() {
            self.rollback(&alloc);
        }
        result.map(|()| alloc)
    }

    fn allocate_inner(
        &mut self,
        service: &mut Value,
        old: Option<&Value>,
        alloc: &mut Allocation,
    ) -> Result<(), Vec<FieldError>> {
        let old_spec = old.map(|o| o["spec"].clone()).unwrap_or(Value::Null);
        let spec = service
            .get_mut("spec")
            .filter(|s| s.is_object())
            .ok_or_else(|| vec![FieldError::required("spec", "")])?;
        let type_ = spec
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or("ClusterIP")
            .to_owned();
        let old_ips = cluster_ips(&old_spec);
        let old_ports = node_ports(&old_spec);

        // ----- ClusterIPs -----
        if type_ == "ExternalName" {
            if let Some(s) = spec.as_object_mut() {
                for field in ["clusterIP", "clusterIPs", "ipFamilies", "ipFamilyPolicy"] {
                    s.remove(field);
                }
            }
        } else {
            let requested = spec
                .get("clusterIP")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned();
            let mut requested_ips: Vec<String> = spec
                .get("clusterIPs")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_str().map(str::to_owned))
                        .collect()
                })
                .unwrap_or_default();
            if requested_ips.is_empty() && !requested.is_empty() {
                requested_ips.push(requested.clone());
            }
            if requested_ips.is_empty() && !old_ips.is_empty() {
                requested_ips = old_ips.iter().map(ToString::to_string).collect();
            } else if requested_ips.is_empty()
                && old_spec.get("clusterIP").and_then(Value::as_str) == Some("None")
            {
                requested_ips.push("None".into());
            }
            if requested_ips.first().map(String::as_str) == Some("None") {
                spec["clusterIP"] = json!("None");
                spec["clusterIPs"] = json!(["None"]);
                let fam = self
                    .ranges
                    .first()
                    .map_or("IPv4", |r| if r.addr().is_ipv6() { "IPv6" } else { "IPv4" });
                if spec.get("ipFamilies").is_none_or(Value::is_null) {
                    spec["ipFamilies"] = json!([fam]);
                }
                if spec.get("ipFamilyPolicy").is_none_or(Value::is_null) {
                    spec["ipFamilyPolicy"] = json!("SingleStack");
                }
            } else {
                let policy = spec
                    .get("ipFamilyPolicy")
                    .and_then(Value::as_str)
                    .unwrap_or("SingleStack")
                    .to_owned();
                let want_families = match policy.as_str() {
                    "SingleStack" => 1,
                    "PreferDualStack" => self.ranges.len().min(2),
                    "RequireDualStack" => {
                        if self.ranges.len() < 2 {
                            return Err(vec![FieldError::invalid(
                                "spec.ipFamilyPolicy",
                                &json!(policy),
                                "this cluster is not configured for dual-stack services",
                            )]);
                        }
                        2
                    }
                    other => {
                        return Err(vec![FieldError::not_supported(
                            "spec.ipFamilyPolicy",
                            &json!(other),
                            &["SingleStack", "PreferDualStack", "RequireDualStack"],
                        )]);
                    }
                };
                let mut ips: Vec<IpAddr> = Vec::new();
                for (i, text) in requested_ips.iter().enumerate() {
                    let field = format!("spec.clusterIPs[{i}]");
                    let ip: IpAddr = text.parse().map_err(|_| {
                        vec![FieldError::invalid(
                            &field,
                            &json!(text),
                            "must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
                        )]
                    })?;
                    if old_ips.contains(&ip) {
                        ips.push(ip);
                        continue;
                    }
                    if !old_ips.is_empty() {
                        return Err(vec![FieldError::invalid(
                            &field,
                            &json!(text),
                            "may not change once set",
                        )]);
                    }
                    if self.range_of(Item::Ip(ip)).is_none() {
                        return Err(vec![FieldError::invalid(
                            "spec.clusterIPs",
                            &json!(requested_ips),
                            format!(
                                "failed to allocate IP {ip}: the provided IP ({ip}) is not in the valid range. The range of valid IPs is {}",
                                self.ranges
                                    .iter()
                                    .map(ToString::to_string)
                                    .collect::<Vec<_>>()
                                    .join(",")
                            ),
                        )]);
                    }
                    if !self.used_ips.insert(ip) {
                        return Err(vec![FieldError::invalid(
                            "spec.clusterIPs",
                            &json!(requested_ips),
                            format!("failed to allocate IP {ip}: provided IP is already allocated"),
                        )]);
                    }
                    alloc.ips.push(ip);
                    ips.push(ip);
                }
                if old.is_some()
                    && !old_ips.is_empty()
                    && ips.len() < old_ips.len().min(want_families)
                {
                    ips = old_ips.clone();
                }
                for range_index in 0..want_families {
                    let fam_v6 = self.ranges[range_index].addr().is_ipv6();
                    if ips.iter().any(|ip| ip.is_ipv6() == fam_v6) {
                        continue;
                    }
                    let ip = self.take_ip(range_index).ok_or_else(|| {
                        vec![FieldError::invalid(
                            "spec.clusterIPs",
                            &Value::Null,
                            format!(
                                "failed to allocate IP: range {} is full",
                                self.ranges[range_index]
                            ),
                        )]
                    })?;
                    alloc.ips.push(ip);
                    ips.push(ip);
                }
                spec["clusterIP"] = json!(ips[0].to_string());
                spec["clusterIPs"] = json!(ips.iter().map(ToString::to_string).collect::<Vec<_>>());
                spec["ipFamilies"] = json!(ips.iter().map(family).collect::<Vec<_>>());
                spec["ipFamilyPolicy"] = json!(policy);
            }
        }
        let now_ips = cluster_ips(spec);
        alloc.released_ips = old_ips
            .iter()
            .filter(|ip| !now_ips.contains(ip))
            .copied()
            .collect();

        // ----- NodePorts -----
        let need_node_ports = wants_node_ports(spec);
        let old_port_entries: Vec<(i64, String, u16)> = old_spec
            .get("ports")
            .and_then(Value::as_array)
            .map(|a| {
                a.iter()
                    .filter_map(|p| {
                        Some((
                            p.get("port")?.as_i64()?,
                            p.get("protocol")
                                .and_then(Value::as_str)
                                .unwrap_or("TCP")
                                .to_owned(),
                            u16::try_from(p.get("nodePort")?.as_u64()?).ok()?,
                        ))
                    })
                    .collect()
            })
            .unwrap_or_default();
        let mut taken_here: Vec<u16> = Vec::new();
        if let Some(ports) = spec.get_mut("ports").and_then(Value::as_array_mut) {
            for (i, port) in ports.iter_mut().enumerate() {
                let field = format!("spec.ports[{i}].nodePort");
                let given = port
                    .get("nodePort")
                    .and_then(Value::as_i64)
                    .filter(|p| *p != 0);
                let number = port.get("port").and_then(Value::as_i64).unwrap_or(0);
                let protocol = port
                    .get("protocol")
                    .and_then(Value::as_str)
                    .unwrap_or("TCP")
                    .to_owned();
                let previous = old_port_entries
                    .iter()
                    .find(|(p, proto, _)| *p == number && *proto == protocol)
                    .map(|(_, _, np)| *np);
                if !need_node_ports {
                    match given {
                        Some(g) if previous != u16::try_from(g).ok() => {
                            return Err(vec![FieldError::forbidden(
                                &field,
                                &format!("may not be used when `type` is '{type_}'"),
                            )]);
                        }
                        _ => {
                            if let Some(p) = port.as_object_mut() {
                                p.remove("nodePort");
                            }
                        }
                    }
                    continue;
                }
                let chosen = match given {
                    Some(g) => {
                        let g16 = u16::try_from(g).ok().filter(|p| self.ports.contains(p)).ok_or_else(|| {
                            vec![FieldError::invalid(&field, &json!(g), format!(
                                "provided port is not in the valid range. The range of valid ports is {}-{}",
                                self.ports.start(), self.ports.end()))]
                        })?;
                        if old_ports.contains(&g16) || taken_here.contains(&g16) {
                            g16
                        } else if self.used_ports.insert(g16) {
                            alloc.ports.push(g16);
                            g16
                        } else {
                            return Err(vec![FieldError::invalid(
                                &field,
                                &json!(g),
                                "provided port is already allocated",
                            )]);
                        }
                    }
                    None => match previous {
                        Some(p) => p,
                        None => {
                            let p = self.take_port().ok_or_else(|| {
                                vec![FieldError::invalid(
                                    &field,
                                    &Value::Null,
                                    "range of node ports is full",
                                )]
                            })?;
                            alloc.ports.push(p);
                            p
                        }
                    },
                };
                taken_here.push(chosen);
                port["nodePort"] = json!(chosen);
            }
        }
        if wants_health_check_port(spec) {
            let given = spec
                .get("healthCheckNodePort")
                .and_then(Value::as_i64)
                .filter(|p| *p != 0);
            let previous = old_spec
                .get("healthCheckNodePort")
                .and_then(Value::as_u64)
                .and_then(|p| u16::try_from(p).ok());
            let chosen = match (given, previous) {
                (Some(g), Some(p)) if u16::try_from(g).ok() == Some(p) => p,
                (Some(g), _) => {
                    let g16 = u16::try_from(g)
                        .ok()
                        .filter(|p| self.ports.contains(p))
                        .ok_or_else(|| {
                            vec![FieldError::invalid(
                                "spec.healthCheckNodePort",
                                &json!(g),
                                "provided port is not in the valid range",
                            )]
                        })?;
                    if !self.used_ports.insert(g16) {
                        return Err(vec![FieldError::invalid(
                            "spec.healthCheckNodePort",
                            &json!(g),
                            "provided port is already allocated",
                        )]);
                    }
                    alloc.ports.push(g16);
                    g16
                }
                (None, Some(p)) => p,
                (None, None) => {
                    let p = self.take_port().ok_or_else(|| {
                        vec![FieldError::invalid(
                            "spec.healthCheckNodePort",
                            &Value::Null,
                            "range of node ports is full",
                        )]
                    })?;
                    alloc.ports.push(p);
                    p
                }
            };
            spec["healthCheckNodePort"] = json!(chosen);
        } else if let Some(s) = spec.as_object_mut() {
            s.remove("healthCheckNodePort");
        }
        let now_ports = node_ports(spec);
        alloc.released_ports = old_ports
            .iter()
            .filter(|p| !now_ports.contains(p))
            .copied()
            .collect();
        Ok(())
    }
}

/// How many repair passes an allocation no Service holds survives before it is released:
/// upstream's `numRepairsBeforeLeakCleanup`, so that an allocation whose Service is still
/// being written (allocated, not yet stored) is not taken back.
pub const REPAIRS_BEFORE_LEAK_CLEANUP: u32 = 3;

/// What one repair pass found and what the stored bitmaps should become.
#[derive(Debug, Clone)]
pub struct RepairOutcome {
    /// The repaired state: every item a Service holds, plus leaks still in their grace.
    pub allocator: ServiceAllocator,
    /// Items a Service holds that the bitmaps did not have (now marked).
    pub missing: Vec<Item>,
    /// Items no Service held for [`REPAIRS_BEFORE_LEAK_CLEANUP`] passes (now released).
    pub released: Vec<Item>,
    /// Items held by more than one Service (left alone, reported: upstream's
    /// `ClusterIPAlreadyAllocated` / `PortAlreadyAllocated` events).
    pub duplicates: Vec<Item>,
    /// Items a Service holds outside every configured range (upstream's
    /// `ClusterIPOutOfRange` / `PortOutOfRange`).
    pub out_of_range: Vec<Item>,
}

/// Upstream's repair loops (`pkg/registry/core/service/ipallocator/controller/repair.go`
/// and `portallocator/controller/repair.go` `runOnce`): rebuilds the bitmaps from the
/// stored Services, keeping an allocation no Service holds for a few passes before
/// releasing it. One per API server; it remembers the leaks it has seen.
#[derive(Debug, Default)]
pub struct Repair {
    leaks: HashMap<Item, u32>,
}

impl Repair {
    /// One pass: `stored` is the state read from the store (read *before* listing the
    /// Services, so an allocation made in between is kept as a leak, not lost), `services`
    /// the stored Services.
    pub fn run(&mut self, stored: &ServiceAllocator, services: &[Value]) -> RepairOutcome {
        let mut rebuilt = stored.clone();
        for item in stored.items() {
            rebuilt.unmark(item);
        }
        let mut duplicates = Vec::new();
        let mut out_of_range = Vec::new();
        for service in services {
            for item in service_items(service) {
                if rebuilt.range_of(item).is_none() {
                    out_of_range.push(item);
                } else if !rebuilt.mark(item) {
                    duplicates.push(item);
                }
            }
        }
        let held = rebuilt.items();
        let stored_items = stored.items();
        let mut missing: Vec<Item> = held.difference(&stored_items).copied().collect();
        missing.sort();
        let mut released = Vec::new();
        let mut leaks = HashMap::new();
        for item in stored_items.difference(&held) {
            let seen = self.leaks.get(item).copied().unwrap_or(0) + 1;
            if seen >= REPAIRS_BEFORE_LEAK_CLEANUP {
                released.push(*item);
            } else {
                rebuilt.mark(*item);
                leaks.insert(*item, seen);
            }
        }
        released.sort();
        self.leaks = leaks;
        RepairOutcome {
            allocator: rebuilt,
            missing,
            released,
            duplicates,
            out_of_range,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allocator() -> ServiceAllocator {
        ServiceAllocator::new(vec!["10.96.0.0/29".parse().unwrap()], 30000..=30003)
    }

    fn svc(type_: &str, ports: &[i64]) -> Value {
        json!({"spec": {"type": type_, "ports": ports.iter().map(|p| json!({"port": p, "protocol": "TCP"})).collect::<Vec<_>>()}})
    }

    #[test]
    fn cluster_ips_are_unique_and_released() {
        let mut a = allocator();
        let mut seen = HashSet::new();
        for _ in 0..6 {
            let mut s = svc("ClusterIP", &[80]);
            a.allocate(&mut s, None).unwrap();
            assert!(seen.insert(s["spec"]["clusterIP"].as_str().unwrap().to_owned()));
            assert_eq!(s["spec"]["ipFamilies"], json!(["IPv4"]));
        }
        // /29 has 6 usable addresses: the seventh fails.
        let mut full = svc("ClusterIP", &[80]);
        let err = a.allocate(&mut full, None).unwrap_err();
        assert!(err[0].message.contains("is full"), "{err:?}");
        // Release one, and it can be had again.
        let mut s = json!({"spec": {"clusterIPs": ["10.96.0.3"]}});
        a.release(&s);
        s = svc("ClusterIP", &[80]);
        a.allocate(&mut s, None).unwrap();
        assert_eq!(s["spec"]["clusterIP"], "10.96.0.3");
    }

    #[test]
    fn node_ports_for_load_balancers_with_health_check_port() {
        let mut a = allocator();
        let mut lb = svc("LoadBalancer", &[80, 443]);
        lb["spec"]["externalTrafficPolicy"] = json!("Local");
        let alloc = a.allocate(&mut lb, None).unwrap();
        let ports: Vec<u64> = lb["spec"]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["nodePort"].as_u64().unwrap())
            .collect();
        assert_eq!(ports.len(), 2);
        assert_ne!(ports[0], ports[1]);
        let hc = lb["spec"]["healthCheckNodePort"].as_u64().unwrap();
        assert!(!ports.contains(&hc));
        assert_eq!(alloc.ports.len(), 3);
        // The range (4 ports) has one left; a second NodePort service with 2 ports fails and
        // takes nothing.
        let mut np = svc("NodePort", &[1, 2]);
        assert!(a.allocate(&mut np, None).is_err());
        let mut np1 = svc("NodePort", &[1]);
        a.allocate(&mut np1, None).unwrap();
    }

    #[test]
    fn chosen_ports_and_ips_are_checked() {
        let mut a = allocator();
        let mut s = svc("NodePort", &[80]);
        s["spec"]["ports"][0]["nodePort"] = json!(30002);
        s["spec"]["clusterIP"] = json!("10.96.0.5");
        a.allocate(&mut s, None).unwrap();
        assert_eq!(s["spec"]["clusterIPs"], json!(["10.96.0.5"]));
        let mut clash = svc("NodePort", &[80]);
        clash["spec"]["ports"][0]["nodePort"] = json!(30002);
        let err = a.allocate(&mut clash, None).unwrap_err();
        assert_eq!(
            err[0].message,
            "Invalid value: 30002: provided port is already allocated"
        );
        let mut out = svc("NodePort", &[80]);
        out["spec"]["ports"][0]["nodePort"] = json!(80);
        assert!(
            a.allocate(&mut out, None).unwrap_err()[0]
                .message
                .contains("valid range")
        );
        let mut ip_clash = svc("ClusterIP", &[80]);
        ip_clash["spec"]["clusterIP"] = json!("10.96.0.5");
        assert!(
            a.allocate(&mut ip_clash, None).unwrap_err()[0]
                .message
                .contains("already allocated")
        );
    }

    #[test]
    fn updates_keep_ports_and_release_what_goes() {
        let mut a = allocator();
        let mut lb = svc("LoadBalancer", &[80]);
        a.allocate(&mut lb, None).unwrap();
        let old = lb.clone();
        // Re-sending the object without node ports keeps them.
        let mut again = svc("LoadBalancer", &[80]);
        let alloc = a.allocate(&mut again, Some(&old)).unwrap();
        assert_eq!(
            again["spec"]["ports"][0]["nodePort"],
            old["spec"]["ports"][0]["nodePort"]
        );
        assert_eq!(again["spec"]["clusterIP"], old["spec"]["clusterIP"]);
        assert!(alloc.ips.is_empty() && alloc.ports.is_empty());
        // Turning it into ClusterIP drops and releases the node port.
        let mut cluster = old.clone();
        cluster["spec"]["type"] = json!("ClusterIP");
        let alloc = a.allocate(&mut cluster, Some(&old)).unwrap();
        assert!(cluster["spec"]["ports"][0].get("nodePort").is_none());
        assert_eq!(alloc.released_ports.len(), 1);
        a.commit(&alloc);
        // The ClusterIP may not change.
        let mut changed = old.clone();
        changed["spec"]["clusterIP"] = json!("10.96.0.6");
        changed["spec"]["clusterIPs"] = json!(["10.96.0.6"]);
        assert!(
            a.allocate(&mut changed, Some(&old)).unwrap_err()[0]
                .message
                .contains("may not change")
        );
    }

    #[test]
    fn snapshots_are_upstream_bitmaps_and_restore() {
        let mut a = allocator();
        let mut lb = svc("NodePort", &[80]);
        a.allocate(&mut lb, None).unwrap();
        // 10.96.0.1 is offset 0, port 30000 offset 0: bit 0 of a one-byte bitmap.
        assert_eq!(lb["spec"]["clusterIP"], "10.96.0.1");
        let ips = a.snapshot(RangeId::Ips(0));
        assert_eq!(ips.range, "10.96.0.0/29");
        assert_eq!(ips.data, vec![0b1]);
        let mut two = svc("ClusterIP", &[80]);
        two["spec"]["clusterIP"] = json!("10.96.0.6");
        a.allocate(&mut two, None).unwrap();
        assert_eq!(a.snapshot(RangeId::Ips(0)).data, vec![0b10_0001]);
        let ports = a.snapshot(RangeId::Ports);
        assert_eq!(
            (ports.range.as_str(), ports.data.as_slice()),
            ("30000-30003", &[1u8][..])
        );
        let stored =
            RangeSnapshot::from_json(&serde_json::to_vec(&ips.to_json()).unwrap()).unwrap();
        assert_eq!(stored, ips);

        let mut b = allocator();
        assert!(b.restore(RangeId::Ips(0), &a.snapshot(RangeId::Ips(0))));
        assert!(b.restore(RangeId::Ports, &ports));
        assert_eq!(b.items(), a.items());
        // A bitmap of another range restores nothing.
        let other = RangeSnapshot {
            range: "10.0.0.0/24".into(),
            data: vec![0xff],
        };
        assert!(!b.restore(RangeId::Ips(0), &other));
        assert!(b.items().iter().all(|i| matches!(i, Item::Port(_))));
    }

    #[test]
    fn bitmaps_span_many_bytes_big_endian() {
        let mut a = ServiceAllocator::new(vec!["10.96.0.0/12".parse().unwrap()], 30000..=32767);
        a.mark(Item::Ip("10.96.1.1".parse().unwrap())); // offset 256
        let data = a.snapshot(RangeId::Ips(0)).data;
        assert_eq!(data.len(), 33);
        assert_eq!(data[0], 1);
        assert!(data[1..].iter().all(|b| *b == 0));
        // The broadcast address of the range is never allocated.
        let mut s = svc("ClusterIP", &[80]);
        s["spec"]["clusterIP"] = json!("10.111.255.255");
        assert!(a.allocate(&mut s, None).is_err(), "broadcast address");
    }

    #[test]
    fn repair_marks_missing_reports_duplicates_and_releases_leaks_after_three_passes() {
        let mut stored = allocator();
        stored.mark(Item::Ip("10.96.0.4".parse().unwrap())); // leaked: no Service has it
        stored.mark(Item::Port(30001));
        let services = vec![
            json!({"spec": {"clusterIPs": ["10.96.0.2"], "ports": [{"port": 80, "nodePort": 30002}]}}),
            json!({"spec": {"clusterIPs": ["10.96.0.2"]}}),
            json!({"spec": {"clusterIPs": ["192.168.0.1"]}}),
        ];
        let mut repair = Repair::default();
        let first = repair.run(&stored, &services);
        assert_eq!(
            first.missing,
            vec![Item::Ip("10.96.0.2".parse().unwrap()), Item::Port(30002)]
        );
        assert_eq!(
            first.duplicates,
            vec![Item::Ip("10.96.0.2".parse().unwrap())]
        );
        assert_eq!(
            first.out_of_range,
            vec![Item::Ip("192.168.0.1".parse().unwrap())]
        );
        assert!(first.released.is_empty(), "leaks get a grace period");
        assert!(first.allocator.items().contains(&Item::Port(30001)));
        let second = repair.run(&first.allocator, &services);
        assert!(second.released.is_empty());
        let third = repair.run(&second.allocator, &services);
        assert_eq!(
            third.released,
            vec![Item::Ip("10.96.0.4".parse().unwrap()), Item::Port(30001)]
        );
        assert_eq!(
            third.allocator.items(),
            [Item::Ip("10.96.0.2".parse().unwrap()), Item::Port(30002)].into()
        );
    }
}
