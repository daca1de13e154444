package libvirt

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	golibvirt "github.com/digitalocean/go-libvirt"
	"libvirt.org/go/libvirtxml"

	"github.com/clusterd/clusterd/infra"
)

// ruleComment records a rule's machine and kind in its filter rule.
func ruleComment(r infra.Rule) string {
	return "clusterd machine=" + r.MachineID + " kind=" + r.Kind
}

// parseComment reads ruleComment back.
func parseComment(s string) (machine, kind string, ok bool) {
	rest, ok := strings.CutPrefix(s, "clusterd machine=")
	if !ok {
		return "", "", false
	}
	machine, kind, ok = strings.Cut(rest, " kind=")
	return machine, kind, ok && machine != "" && kind != ""
}

// filter reads the cluster's network filter; found is false when there is none.
func (d *Driver) filter(ctx context.Context, clusterID string) (f libvirtxml.NWFilter, found bool, err error) {
	if err := ctx.Err(); err != nil {
		return f, false, err
	}
	name := FilterName(clusterID)
	nf, err := d.filterConn().NwfilterLookupByName(name)
	if libvirtCode(err) == golibvirt.ErrNoNwfilter {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("look up network filter %s: %w", name, err)
	}
	s, err := d.filterConn().NwfilterGetXMLDesc(nf, 0)
	if libvirtCode(err) == golibvirt.ErrNoNwfilter {
		return f, false, nil
	}
	if err != nil {
		return f, false, fmt.Errorf("read network filter %s: %w", name, err)
	}
	if err := f.Unmarshal(s); err != nil {
		return f, false, fmt.Errorf("decode network filter %s: %w", name, err)
	}
	return f, true, nil
}

// Rules lists a cluster's network rules, read from its network filter.
func (d *Driver) Rules(ctx context.Context, clusterID string) ([]infra.Rule, error) {
	f, _, err := d.filter(ctx, clusterID)
	if err != nil {
		return nil, err
	}
	var out []infra.Rule
	for _, e := range f.Entries {
		if e.Rule == nil || e.Rule.TCP == nil || e.Rule.TCP.DstPortStart.Uint == nil {
			continue
		}
		machine, kind, ok := parseComment(e.Rule.TCP.Comment)
		if !ok {
			continue
		}
		out = append(out, infra.Rule{MachineID: machine, Kind: kind, Port: int32(*e.Rule.TCP.DstPortStart.Uint)})
	}
	return out, nil
}

// ConfigureNetwork makes the call's cluster's network filter hold exactly
// want, in one definition (so no rule that stays is ever missing), and
// records the filter in the metadata of the cluster's machines (the
// binding; see the package doc). No rules undefine the filter.
func (d *Driver) ConfigureNetwork(ctx context.Context, c infra.Call, want []infra.Rule) error {
	const step = infra.StepConfigureNetwork
	if c.ClusterID == "" {
		return fmt.Errorf("%s: the call names no cluster", step)
	}
	rules := slices.Clone(want)
	for _, r := range rules {
		if r.MachineID == "" || r.Kind == "" || strings.ContainsAny(r.MachineID+r.Kind, " '\"<>&") || r.Port < 1 || r.Port > 65535 {
			return fmt.Errorf("%s: invalid rule %+v", step, r)
		}
	}
	slices.SortFunc(rules, func(a, b infra.Rule) int {
		return cmp.Or(strings.Compare(a.MachineID, b.MachineID), strings.Compare(a.Kind, b.Kind), cmp.Compare(a.Port, b.Port))
	})
	rules = slices.Compact(rules)
	if err := d.fence(ctx, step, c, "before"); err != nil {
		return err
	}
	name := FilterName(c.ClusterID)
	have, found, err := d.filter(ctx, c.ClusterID)
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	if len(rules) == 0 {
		if found {
			if err := d.undefineFilter(ctx, c.ClusterID); err != nil {
				return fmt.Errorf("%s: %w", step, err)
			}
		}
	} else {
		f := libvirtxml.NWFilter{Name: name, UUID: have.UUID, Chain: "root"}
		for _, r := range rules {
			port := uint(r.Port)
			f.Entries = append(f.Entries, libvirtxml.NWFilterEntry{Rule: &libvirtxml.NWFilterRule{
				Action: "accept", Direction: "in", Priority: 500,
				TCP: &libvirtxml.NWFilterRuleTCP{
					NWFilterRuleCommonPort: libvirtxml.NWFilterRuleCommonPort{DstPortStart: libvirtxml.NWFilterField{Uint: &port}},
					Comment:                ruleComment(r),
				},
			}})
		}
		x, err := f.Marshal()
		if err != nil {
			return fmt.Errorf("%s: encode network filter %s: %w", step, name, err)
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if _, err := d.filterConn().NwfilterDefineXML(x); err != nil {
			return fmt.Errorf("%s: define network filter %s: %w", step, name, err)
		}
	}
	if err := d.bind(ctx, step, c, len(rules) > 0); err != nil {
		return err
	}
	return d.fence(ctx, step, c, "after")
}

// bind records the cluster's filter (or, unbound, none) in the metadata of
// each of the cluster's machines.
func (d *Driver) bind(ctx context.Context, step string, c infra.Call, bound bool) error {
	ms, err := d.Machines(ctx, c.ClusterID)
	if err != nil {
		return fmt.Errorf("%s: %w", step, err)
	}
	name := ""
	if bound {
		name = FilterName(c.ClusterID)
	}
	for _, m := range ms {
		mc := c
		mc.MachineID = m.ID
		err := d.changeLocked(ctx, step, mc, true, func(dm *domain) error {
			if dm.meta.Filter == name {
				return nil
			}
			dm.meta.Filter = name
			return d.writeMeta(ctx, dm.dom, dm.meta)
		})
		if errors.Is(err, infra.ErrNotFound) || errors.Is(err, infra.ErrUnusable) {
			continue // destroyed or deleted from the cluster meanwhile
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// undefineFilter removes the cluster's network filter; gone is removed.
func (d *Driver) undefineFilter(ctx context.Context, clusterID string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	name := FilterName(clusterID)
	nf, err := d.filterConn().NwfilterLookupByName(name)
	if err == nil {
		err = d.filterConn().NwfilterUndefine(nf)
	}
	if err != nil && libvirtCode(err) != golibvirt.ErrNoNwfilter {
		return fmt.Errorf("undefine network filter %s: %w", name, err)
	}
	return nil
}

// dropFilterIfLast undefines the cluster's network filter once the cluster
// has no machine left.
func (d *Driver) dropFilterIfLast(ctx context.Context, clusterID string) error {
	if clusterID == "" {
		return nil
	}
	ms, err := d.Machines(ctx, clusterID)
	if err != nil || len(ms) > 0 {
		return err
	}
	return d.undefineFilter(ctx, clusterID)
}
