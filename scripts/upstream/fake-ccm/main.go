// Command cloud-controller-manager is upstream's cloud-controller-manager (k8s.io/cloud-provider's
// app, exactly as k8s.io/cloud-provider/sample/basic_main.go runs it) over "fake", a small
// in-memory provider of ours that answers as ccm-rs' fake cloud (providers/fake) does:
//
//   - every Node is an instance: provider ID fake://<node name>, its addresses the Node's own
//     (alpha.kubernetes.io/provided-node-ip, else status.addresses, else its name as Hostname),
//     its zone and region from its topology labels, else --fake-zone and --fake-region, its
//     type from node.kubernetes.io/instance-type, else --fake-instance-type;
//   - the annotation fake.ccm-rs.io/instance on a Node plays the instance's state: "stopped"
//     (exists, shut down) or "terminated" (gone), so the node lifecycle controller has work;
//   - load balancers get an ingress IP from --fake-lb-cidr (127.2.0.1 onwards, as the embedded
//     default's), kept until the Service's load balancer is deleted;
//   - routes are kept in memory, as the route controller creates and deletes them;
//   - every call first waits --fake-latency (default 20ms, or $FAKE_CLOUD_LATENCY), as a
//     cloud's API does.
//
// scripts/upstream.sh builds it, stamped as upstream's release (cloud-controller-manager
// --version says v1.35.x), into the upstream cache; it is the judge the Rust ccm's
// controllers are compared with. Run it as any cloud-controller-manager:
//
//	cloud-controller-manager --cloud-provider=fake --kubeconfig=KC --authentication-kubeconfig=KC \
//	    --authorization-kubeconfig=KC --leader-elect=false --secure-port=0 \
//	    --cluster-cidr=10.244.0.0/16 --allocate-node-cidrs --configure-cloud-routes
package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	clientset "k8s.io/client-go/kubernetes"
	cloudprovider "k8s.io/cloud-provider"
	"k8s.io/cloud-provider/app"
	"k8s.io/cloud-provider/app/config"
	"k8s.io/cloud-provider/names"
	"k8s.io/cloud-provider/options"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/logs/json/register"          // the JSON log format, as upstream's
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go's metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // the version metric
	"k8s.io/klog/v2"
)

const (
	providerName     = "fake"
	providerIDPrefix = "fake://"
	// stateAnnotation plays the instance's state: "stopped" or "terminated".
	stateAnnotation = "fake.ccm-rs.io/instance"
)

// settings are the fake's flags (the "fake cloud" flag set).
type settings struct {
	latency      time.Duration
	zone         string
	region       string
	instanceType string
	lbCIDR       string
	instancesV2  bool
}

var flags = settings{
	latency:      20 * time.Millisecond,
	zone:         "fake-zone-a",
	region:       "fake-region-1",
	instanceType: "fake.medium",
	lbCIDR:       "127.2.0.0/16",
	instancesV2:  true,
}

func main() {
	if env := os.Getenv("FAKE_CLOUD_LATENCY"); env != "" {
		latency, err := time.ParseDuration(env)
		if err != nil {
			fmt.Fprintf(os.Stderr, "FAKE_CLOUD_LATENCY=%q: %v\n", env, err)
			os.Exit(1)
		}
		flags.latency = latency
	}
	ccmOptions, err := options.NewCloudControllerManagerOptions()
	if err != nil {
		klog.Fatalf("unable to initialize command options: %v", err)
	}
	fss := cliflag.NamedFlagSets{}
	fs := fss.FlagSet("fake cloud")
	fs.DurationVar(&flags.latency, "fake-latency", flags.latency,
		"How long every call to the fake cloud waits before it answers ($FAKE_CLOUD_LATENCY sets the default).")
	fs.StringVar(&flags.zone, "fake-zone", flags.zone, "The zone of Nodes without a topology.kubernetes.io/zone label, and GetZone's.")
	fs.StringVar(&flags.region, "fake-region", flags.region, "The region of Nodes without a topology.kubernetes.io/region label.")
	fs.StringVar(&flags.instanceType, "fake-instance-type", flags.instanceType, "The instance type of Nodes without a node.kubernetes.io/instance-type label.")
	fs.StringVar(&flags.lbCIDR, "fake-lb-cidr", flags.lbCIDR, "The IPv4 range load balancers' ingress IPs come from (its first address is skipped).")
	fs.BoolVar(&flags.instancesV2, "fake-instances-v2", flags.instancesV2, "Offer InstancesV2 (else only Instances, the older interface).")

	cloudprovider.RegisterCloudProvider(providerName, func(io.Reader) (cloudprovider.Interface, error) {
		return newFakeCloud(flags)
	})
	command := app.NewCloudControllerManagerCommand(ccmOptions, cloudInitializer, app.DefaultInitFuncConstructors,
		names.CCMControllerAliases(), fss, wait.NeverStop)
	os.Exit(cli.Run(command))
}

// cloudInitializer is the sample's: the provider named by --cloud-provider, with its config.
func cloudInitializer(config *config.CompletedConfig) cloudprovider.Interface {
	cloudConfig := config.ComponentConfig.KubeCloudShared.CloudProvider
	cloud, err := cloudprovider.InitCloudProvider(cloudConfig.Name, cloudConfig.CloudConfigFile)
	if err != nil {
		klog.Fatalf("Cloud provider could not be initialized: %v", err)
	}
	if cloud == nil {
		klog.Fatalf("Cloud provider is nil")
	}
	return cloud
}

// fakeCloud is the provider: every part of cloudprovider.Interface but Clusters.
type fakeCloud struct {
	settings
	lbPrefix netip.Prefix

	// client reads Nodes for the calls that only name one (Instances, Zones by name); nil
	// before Initialize, and a failed read falls back to what the name alone gives.
	client clientset.Interface

	mu      sync.Mutex
	lbs     map[string]netip.Addr // load balancer name -> ingress IP
	nextLB  netip.Addr
	freeLBs []netip.Addr
	routes  map[string]*cloudprovider.Route // route name -> route
}

func newFakeCloud(s settings) (*fakeCloud, error) {
	prefix, err := netip.ParsePrefix(s.lbCIDR)
	if err != nil || !prefix.Addr().Is4() {
		return nil, fmt.Errorf("--fake-lb-cidr %q: an IPv4 CIDR is needed", s.lbCIDR)
	}
	prefix = prefix.Masked()
	return &fakeCloud{
		settings: s,
		lbPrefix: prefix,
		lbs:      map[string]netip.Addr{},
		nextLB:   prefix.Addr().Next(),
		routes:   map[string]*cloudprovider.Route{},
	}, nil
}

// call waits the cloud's latency, or until the caller gives up.
func (c *fakeCloud) call(ctx context.Context, method string) error {
	klog.V(4).InfoS("fake cloud call", "method", method)
	if c.latency <= 0 {
		return ctx.Err()
	}
	timer := time.NewTimer(c.latency)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *fakeCloud) Initialize(clientBuilder cloudprovider.ControllerClientBuilder, _ <-chan struct{}) {
	client, err := clientBuilder.Client("fake-cloud-provider")
	if err != nil {
		klog.Warningf("fake cloud: no API client (%v); lookups by node name answer from the name alone", err)
		return
	}
	c.client = client
}

func (c *fakeCloud) LoadBalancer() (cloudprovider.LoadBalancer, bool) { return c, true }
func (c *fakeCloud) Instances() (cloudprovider.Instances, bool)       { return c, true }
func (c *fakeCloud) InstancesV2() (cloudprovider.InstancesV2, bool) {
	if !c.instancesV2 {
		return nil, false
	}
	return c, true
}
func (c *fakeCloud) Zones() (cloudprovider.Zones, bool)       { return c, true }
func (c *fakeCloud) Clusters() (cloudprovider.Clusters, bool) { return nil, false }
func (c *fakeCloud) Routes() (cloudprovider.Routes, bool)     { return c, true }
func (c *fakeCloud) ProviderName() string                     { return providerName }
func (c *fakeCloud) HasClusterID() bool                       { return true }

// ---- instances: every Node is one -------------------------------------------------------

// node reads a Node by name; nil when there is no client or the read fails (the name alone
// then answers).
func (c *fakeCloud) node(ctx context.Context, name string) *v1.Node {
	if c.client == nil || name == "" {
		return nil
	}
	node, err := c.client.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		if !apierrors.IsNotFound(err) {
			klog.V(2).InfoS("fake cloud: reading the Node failed", "node", name, "err", err)
		}
		return nil
	}
	return node
}

func nodeNameOf(providerID string) (string, error) {
	name, ok := strings.CutPrefix(providerID, providerIDPrefix)
	if !ok || name == "" {
		return "", fmt.Errorf("provider ID %q is not the fake cloud's (%s<node>)", providerID, providerIDPrefix)
	}
	return name, nil
}

func state(node *v1.Node) string {
	if node == nil {
		return ""
	}
	return node.Annotations[stateAnnotation]
}

func (c *fakeCloud) providerID(node *v1.Node, name string) string {
	if node != nil && strings.HasPrefix(node.Spec.ProviderID, providerIDPrefix) {
		return node.Spec.ProviderID
	}
	return providerIDPrefix + name
}

// addresses: the IP the kubelet was given (--node-ip), else the Node's own addresses, and its
// name as Hostname.
func (c *fakeCloud) addresses(node *v1.Node, name string) []v1.NodeAddress {
	var out []v1.NodeAddress
	seen := map[v1.NodeAddress]bool{}
	add := func(a v1.NodeAddress) {
		if a.Address != "" && !seen[a] {
			seen[a] = true
			out = append(out, a)
		}
	}
	if node != nil {
		for _, ip := range strings.Split(node.Annotations["alpha.kubernetes.io/provided-node-ip"], ",") {
			if net.ParseIP(strings.TrimSpace(ip)) != nil {
				add(v1.NodeAddress{Type: v1.NodeInternalIP, Address: strings.TrimSpace(ip)})
			}
		}
		for _, a := range node.Status.Addresses {
			add(a)
		}
	}
	add(v1.NodeAddress{Type: v1.NodeHostName, Address: name})
	return out
}

func label(node *v1.Node, fallback string, keys ...string) string {
	if node != nil {
		for _, key := range keys {
			if value := node.Labels[key]; value != "" {
				return value
			}
		}
	}
	return fallback
}

func (c *fakeCloud) zone(node *v1.Node) cloudprovider.Zone {
	return cloudprovider.Zone{
		FailureDomain: label(node, c.settings.zone, v1.LabelTopologyZone, v1.LabelFailureDomainBetaZone),
		Region:        label(node, c.region, v1.LabelTopologyRegion, v1.LabelFailureDomainBetaRegion),
	}
}

func (c *fakeCloud) instanceTypeOf(node *v1.Node) string {
	return label(node, c.instanceType, v1.LabelInstanceTypeStable, v1.LabelInstanceType)
}

// InstancesV2

func (c *fakeCloud) InstanceExists(ctx context.Context, node *v1.Node) (bool, error) {
	if err := c.call(ctx, "InstanceExists"); err != nil {
		return false, err
	}
	return state(node) != "terminated", nil
}

func (c *fakeCloud) InstanceShutdown(ctx context.Context, node *v1.Node) (bool, error) {
	if err := c.call(ctx, "InstanceShutdown"); err != nil {
		return false, err
	}
	return state(node) == "stopped", nil
}

func (c *fakeCloud) InstanceMetadata(ctx context.Context, node *v1.Node) (*cloudprovider.InstanceMetadata, error) {
	if err := c.call(ctx, "InstanceMetadata"); err != nil {
		return nil, err
	}
	if state(node) == "terminated" {
		return nil, cloudprovider.InstanceNotFound
	}
	zone := c.zone(node)
	return &cloudprovider.InstanceMetadata{
		ProviderID:    c.providerID(node, node.Name),
		InstanceType:  c.instanceTypeOf(node),
		NodeAddresses: c.addresses(node, node.Name),
		Zone:          zone.FailureDomain,
		Region:        zone.Region,
	}, nil
}

// Instances (the older interface, by name or provider ID)

func (c *fakeCloud) byName(ctx context.Context, method string, name types.NodeName) (*v1.Node, error) {
	if err := c.call(ctx, method); err != nil {
		return nil, err
	}
	node := c.node(ctx, string(name))
	if state(node) == "terminated" {
		return nil, cloudprovider.InstanceNotFound
	}
	return node, nil
}

func (c *fakeCloud) byProviderID(ctx context.Context, method, providerID string) (*v1.Node, string, error) {
	if err := c.call(ctx, method); err != nil {
		return nil, "", err
	}
	name, err := nodeNameOf(providerID)
	if err != nil {
		return nil, "", err
	}
	return c.node(ctx, name), name, nil
}

func (c *fakeCloud) NodeAddresses(ctx context.Context, name types.NodeName) ([]v1.NodeAddress, error) {
	node, err := c.byName(ctx, "NodeAddresses", name)
	if err != nil {
		return nil, err
	}
	return c.addresses(node, string(name)), nil
}

func (c *fakeCloud) NodeAddressesByProviderID(ctx context.Context, providerID string) ([]v1.NodeAddress, error) {
	node, name, err := c.byProviderID(ctx, "NodeAddressesByProviderID", providerID)
	if err != nil {
		return nil, err
	}
	if state(node) == "terminated" {
		return nil, cloudprovider.InstanceNotFound
	}
	return c.addresses(node, name), nil
}

func (c *fakeCloud) InstanceID(ctx context.Context, name types.NodeName) (string, error) {
	if _, err := c.byName(ctx, "InstanceID", name); err != nil {
		return "", err
	}
	// The provider ID is providerIDPrefix + the instance ID: here the node's name.
	return string(name), nil
}

func (c *fakeCloud) InstanceType(ctx context.Context, name types.NodeName) (string, error) {
	node, err := c.byName(ctx, "InstanceType", name)
	if err != nil {
		return "", err
	}
	return c.instanceTypeOf(node), nil
}

func (c *fakeCloud) InstanceTypeByProviderID(ctx context.Context, providerID string) (string, error) {
	node, _, err := c.byProviderID(ctx, "InstanceTypeByProviderID", providerID)
	if err != nil {
		return "", err
	}
	if state(node) == "terminated" {
		return "", cloudprovider.InstanceNotFound
	}
	return c.instanceTypeOf(node), nil
}

func (c *fakeCloud) AddSSHKeyToAllInstances(context.Context, string, []byte) error {
	return cloudprovider.NotImplemented
}

func (c *fakeCloud) CurrentNodeName(_ context.Context, hostname string) (types.NodeName, error) {
	return types.NodeName(hostname), nil
}

func (c *fakeCloud) InstanceExistsByProviderID(ctx context.Context, providerID string) (bool, error) {
	node, _, err := c.byProviderID(ctx, "InstanceExistsByProviderID", providerID)
	if err != nil {
		return false, err
	}
	return state(node) != "terminated", nil
}

func (c *fakeCloud) InstanceShutdownByProviderID(ctx context.Context, providerID string) (bool, error) {
	node, _, err := c.byProviderID(ctx, "InstanceShutdownByProviderID", providerID)
	if err != nil {
		return false, err
	}
	return state(node) == "stopped", nil
}

// ---- zones ----------------------------------------------------------------------------

func (c *fakeCloud) GetZone(ctx context.Context) (cloudprovider.Zone, error) {
	if err := c.call(ctx, "GetZone"); err != nil {
		return cloudprovider.Zone{}, err
	}
	return c.zone(nil), nil
}

func (c *fakeCloud) GetZoneByProviderID(ctx context.Context, providerID string) (cloudprovider.Zone, error) {
	node, _, err := c.byProviderID(ctx, "GetZoneByProviderID", providerID)
	if err != nil {
		return cloudprovider.Zone{}, err
	}
	return c.zone(node), nil
}

func (c *fakeCloud) GetZoneByNodeName(ctx context.Context, name types.NodeName) (cloudprovider.Zone, error) {
	node, err := c.byName(ctx, "GetZoneByNodeName", name)
	if err != nil {
		return cloudprovider.Zone{}, err
	}
	return c.zone(node), nil
}

// ---- load balancers ---------------------------------------------------------------------

func (c *fakeCloud) status(ip netip.Addr) *v1.LoadBalancerStatus {
	return &v1.LoadBalancerStatus{Ingress: []v1.LoadBalancerIngress{{IP: ip.String()}}}
}

func (c *fakeCloud) GetLoadBalancer(ctx context.Context, _ string, service *v1.Service) (*v1.LoadBalancerStatus, bool, error) {
	if err := c.call(ctx, "GetLoadBalancer"); err != nil {
		return nil, false, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	ip, ok := c.lbs[cloudprovider.DefaultLoadBalancerName(service)]
	if !ok {
		return nil, false, nil
	}
	return c.status(ip), true, nil
}

func (c *fakeCloud) GetLoadBalancerName(_ context.Context, _ string, service *v1.Service) string {
	return cloudprovider.DefaultLoadBalancerName(service)
}

func (c *fakeCloud) EnsureLoadBalancer(ctx context.Context, _ string, service *v1.Service, nodes []*v1.Node) (*v1.LoadBalancerStatus, error) {
	if err := c.call(ctx, "EnsureLoadBalancer"); err != nil {
		return nil, err
	}
	name := cloudprovider.DefaultLoadBalancerName(service)
	c.mu.Lock()
	defer c.mu.Unlock()
	ip, ok := c.lbs[name]
	if !ok {
		switch {
		case len(c.freeLBs) > 0:
			ip, c.freeLBs = c.freeLBs[0], c.freeLBs[1:]
		case c.lbPrefix.Contains(c.nextLB):
			ip, c.nextLB = c.nextLB, c.nextLB.Next()
		default:
			return nil, fmt.Errorf("the fake cloud's load balancer addresses (%s) are used up", c.lbPrefix)
		}
		c.lbs[name] = ip
		klog.InfoS("fake cloud: load balancer created", "name", name, "ip", ip, "service", klog.KObj(service), "nodes", len(nodes))
	}
	return c.status(ip), nil
}

func (c *fakeCloud) UpdateLoadBalancer(ctx context.Context, _ string, service *v1.Service, nodes []*v1.Node) error {
	if err := c.call(ctx, "UpdateLoadBalancer"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	name := cloudprovider.DefaultLoadBalancerName(service)
	if _, ok := c.lbs[name]; !ok {
		return fmt.Errorf("load balancer %s does not exist", name)
	}
	klog.V(2).InfoS("fake cloud: load balancer updated", "name", name, "nodes", len(nodes))
	return nil
}

func (c *fakeCloud) EnsureLoadBalancerDeleted(ctx context.Context, _ string, service *v1.Service) error {
	if err := c.call(ctx, "EnsureLoadBalancerDeleted"); err != nil {
		return err
	}
	name := cloudprovider.DefaultLoadBalancerName(service)
	c.mu.Lock()
	defer c.mu.Unlock()
	if ip, ok := c.lbs[name]; ok {
		delete(c.lbs, name)
		c.freeLBs = append(c.freeLBs, ip)
		klog.InfoS("fake cloud: load balancer deleted", "name", name, "ip", ip)
	}
	return nil
}

// ---- routes -----------------------------------------------------------------------------

func (c *fakeCloud) ListRoutes(ctx context.Context, _ string) ([]*cloudprovider.Route, error) {
	if err := c.call(ctx, "ListRoutes"); err != nil {
		return nil, err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*cloudprovider.Route, 0, len(c.routes))
	for _, route := range c.routes {
		copied := *route
		out = append(out, &copied)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, nil
}

func (c *fakeCloud) CreateRoute(ctx context.Context, _ string, nameHint string, route *cloudprovider.Route) error {
	if err := c.call(ctx, "CreateRoute"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	copied := *route
	copied.Name = nameHint
	c.routes[nameHint] = &copied
	klog.InfoS("fake cloud: route created", "name", nameHint, "node", route.TargetNode, "cidr", route.DestinationCIDR)
	return nil
}

func (c *fakeCloud) DeleteRoute(ctx context.Context, _ string, route *cloudprovider.Route) error {
	if err := c.call(ctx, "DeleteRoute"); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.routes, route.Name)
	klog.InfoS("fake cloud: route deleted", "name", route.Name, "cidr", route.DestinationCIDR)
	return nil
}
