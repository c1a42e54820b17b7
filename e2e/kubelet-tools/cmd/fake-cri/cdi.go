package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"slices"
	"strings"

	runtimeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"sigs.k8s.io/yaml"
)

// cdiResolver checks CDI device names against the spec files on disk, read afresh on every
// call (the plugin writes and removes spec files while the runtime runs).
//
// Semantics follow what a CDI-enabled runtime does with its spec directories:
//   - spec files are the *.json, *.yaml and *.yml files directly in each directory;
//   - a spec that cannot be parsed, has a malformed kind or names a device twice is ignored
//     (its devices do not resolve) and the reason is reported with the unresolvable devices;
//   - the same device in two specs of one directory is a conflict and resolves to neither;
//   - a device in a later directory overrides one in an earlier directory.
type cdiResolver struct {
	dirs []string
}

type cdiSpec struct {
	Kind    string `json:"kind"`
	Devices []struct {
		Name string `json:"name"`
	} `json:"devices"`
}

type cdiEntry struct {
	dir      int
	file     string
	conflict string // other file of the same directory that defines the device too
}

// parseQualifiedName splits "vendor/class=name".
func parseQualifiedName(q string) (kind, name string, err error) {
	kind, name, ok := strings.Cut(q, "=")
	if !ok || name == "" {
		return "", "", fmt.Errorf("%q is not a fully qualified CDI device name (vendor/class=name)", q)
	}
	if err := validKind(kind); err != nil {
		return "", "", fmt.Errorf("%q: %v", q, err)
	}
	return kind, name, nil
}

func validKind(kind string) error {
	vendor, class, ok := strings.Cut(kind, "/")
	if !ok || vendor == "" || class == "" || strings.Contains(class, "/") {
		return fmt.Errorf("invalid CDI kind %q (want vendor/class)", kind)
	}
	return nil
}

// scan reads all spec directories and returns the devices by qualified name, plus the
// problems found with individual spec files.
func (c *cdiResolver) scan() (map[string]*cdiEntry, []string) {
	devices := map[string]*cdiEntry{}
	var problems []string
	for di, dir := range c.dirs {
		entries, err := os.ReadDir(dir)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				problems = append(problems, fmt.Sprintf("read CDI dir %s: %v", dir, err))
			}
			continue
		}
		for _, e := range entries {
			ext := filepath.Ext(e.Name())
			if e.IsDir() || (ext != ".json" && ext != ".yaml" && ext != ".yml") {
				continue
			}
			path := filepath.Join(dir, e.Name())
			names, err := readSpec(path)
			if err != nil {
				problems = append(problems, fmt.Sprintf("CDI spec %s ignored: %v", path, err))
				continue
			}
			for _, q := range names {
				old := devices[q]
				switch {
				case old == nil || old.dir < di:
					devices[q] = &cdiEntry{dir: di, file: path}
				case old.conflict == "":
					old.conflict = path
				}
			}
		}
	}
	return devices, problems
}

// readSpec returns the qualified device names a spec file defines.
func readSpec(path string) ([]string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var spec cdiSpec
	if filepath.Ext(path) == ".json" {
		err = json.Unmarshal(data, &spec)
	} else {
		err = yaml.Unmarshal(data, &spec)
	}
	if err != nil {
		return nil, fmt.Errorf("parse: %v", err)
	}
	if err := validKind(spec.Kind); err != nil {
		return nil, err
	}
	var names []string
	for _, d := range spec.Devices {
		if d.Name == "" {
			return nil, errors.New("device with empty name")
		}
		q := spec.Kind + "=" + d.Name
		if slices.Contains(names, q) {
			return nil, fmt.Errorf("device %q defined twice", d.Name)
		}
		names = append(names, q)
	}
	return names, nil
}

// Resolve returns an error naming every device that does not resolve to exactly one spec.
func (c *cdiResolver) Resolve(reqs []*runtimeapi.CDIDevice) error {
	if len(reqs) == 0 {
		return nil
	}
	devices, problems := c.scan()
	for _, p := range problems {
		log.Print(p)
	}
	var bad, reasons []string
	for _, r := range reqs {
		q := r.GetName()
		if _, _, err := parseQualifiedName(q); err != nil {
			bad = append(bad, q)
			reasons = append(reasons, err.Error())
			continue
		}
		e := devices[q]
		switch {
		case e == nil:
			bad = append(bad, q)
		case e.conflict != "":
			bad = append(bad, q)
			reasons = append(reasons, fmt.Sprintf("%s: conflicting definitions in %s and %s", q, e.file, e.conflict))
		}
	}
	if len(bad) == 0 {
		return nil
	}
	msg := "CDI device injection failed: unresolvable CDI devices " + strings.Join(bad, ", ")
	if len(c.dirs) == 0 {
		reasons = append(reasons, "no CDI spec directories configured")
	}
	reasons = append(reasons, problems...)
	if len(reasons) > 0 {
		msg += " (" + strings.Join(reasons, "; ") + ")"
	}
	return errors.New(msg)
}
