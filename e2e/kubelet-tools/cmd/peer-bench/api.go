package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"time"

	"sigs.k8s.io/yaml"
)

// apiClient is the little of the Kubernetes API the bench needs, over plain HTTPS: the e2e
// kubeconfig (server, CA file, bearer token) is all it reads, so no client-go is pulled in.
type apiClient struct {
	server string
	token  string
	http   *http.Client
}

type kubeconfig struct {
	Clusters []struct {
		Cluster struct {
			Server string `json:"server"`
			CA     string `json:"certificate-authority"`
		} `json:"cluster"`
	} `json:"clusters"`
	Users []struct {
		User struct {
			Token string `json:"token"`
		} `json:"user"`
	} `json:"users"`
}

func newAPIClient(path string) (*apiClient, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfig
	if err := yaml.Unmarshal(raw, &kc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if len(kc.Clusters) == 0 || len(kc.Users) == 0 || kc.Clusters[0].Cluster.Server == "" {
		return nil, fmt.Errorf("%s: needs a cluster with a server and a user with a token", path)
	}
	tlsConf := &tls.Config{MinVersion: tls.VersionTLS12}
	if ca := kc.Clusters[0].Cluster.CA; ca != "" {
		pem, err := os.ReadFile(ca)
		if err != nil {
			return nil, err
		}
		tlsConf.RootCAs = x509.NewCertPool()
		if !tlsConf.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s: no certificate", ca)
		}
	}
	return &apiClient{
		server: kc.Clusters[0].Cluster.Server,
		token:  kc.Users[0].User.Token,
		http:   &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsConf}},
	}, nil
}

// do sends body (JSON-encoded unless nil) and decodes the answer into out (unless nil).
// okCodes lists further statuses that count as success (e.g. 409 for create-if-missing).
func (c *apiClient) do(ctx context.Context, method, path, contentType string, body, out any, okCodes ...int) error {
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.server+path, rd)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		if slices.Contains(okCodes, resp.StatusCode) {
			return nil
		}
		return fmt.Errorf("%s %s: %s: %s", method, path, resp.Status, bytes.TrimSpace(raw))
	}
	if out != nil {
		return json.Unmarshal(raw, out)
	}
	return nil
}

// ensureNamespace creates ns, labelled so that claims in it may ask for admin access.
func (c *apiClient) ensureNamespace(ctx context.Context, ns string) error {
	obj := map[string]any{
		"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{
			"name":   ns,
			"labels": map[string]string{"resource.kubernetes.io/admin-access": "true"},
		},
	}
	return c.do(ctx, http.MethodPost, "/api/v1/namespaces", "application/json", obj, nil, http.StatusConflict)
}

type sliceList struct {
	Items []struct {
		Spec struct {
			Driver string `json:"driver"`
			Pool   struct {
				Name string `json:"name"`
			} `json:"pool"`
			Devices []struct {
				Name string `json:"name"`
			} `json:"devices"`
		} `json:"spec"`
	} `json:"items"`
}

// devices lists the device names published for node by driver, in slice order.
func (c *apiClient) devices(ctx context.Context, node, driver string) (pool string, names []string, err error) {
	q := url.Values{"fieldSelector": {"spec.nodeName=" + node + ",spec.driver=" + driver}}
	var l sliceList
	if err := c.do(ctx, http.MethodGet, "/apis/resource.k8s.io/v1/resourceslices?"+q.Encode(), "", nil, &l); err != nil {
		return "", nil, err
	}
	for _, s := range l.Items {
		pool = s.Spec.Pool.Name
		for _, d := range s.Spec.Devices {
			names = append(names, d.Name)
		}
	}
	return pool, names, nil
}

type claimRef struct {
	Namespace, Name, UID string
}

// createAllocatedClaim creates a claim for one device of class and allocates it as the scheduler
// would, through the status subresource. Admin access lets many claims hold one device at once,
// so that 64 claims can be in flight on 8 devices; neither plugin does extra work for it.
func (c *apiClient) createAllocatedClaim(ctx context.Context, ns, name, class, driver, pool, device string) (claimRef, error) {
	obj := map[string]any{
		"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
		"metadata": map[string]any{"name": name, "namespace": ns},
		"spec": map[string]any{"devices": map[string]any{"requests": []any{map[string]any{
			"name":    "gpu",
			"exactly": map[string]any{"deviceClassName": class, "adminAccess": true},
		}}}},
	}
	base := "/apis/resource.k8s.io/v1/namespaces/" + ns + "/resourceclaims"
	var created struct {
		Metadata struct {
			UID string `json:"uid"`
		} `json:"metadata"`
	}
	if err := c.do(ctx, http.MethodPost, base, "application/json", obj, &created); err != nil {
		return claimRef{}, err
	}
	status := map[string]any{"status": map[string]any{"allocation": map[string]any{"devices": map[string]any{
		"results": []any{map[string]any{
			"request": "gpu", "driver": driver, "pool": pool, "device": device, "adminAccess": true,
		}},
	}}}}
	if err := c.do(ctx, http.MethodPatch, base+"/"+name+"/status", "application/merge-patch+json", status, nil); err != nil {
		return claimRef{}, err
	}
	return claimRef{Namespace: ns, Name: name, UID: created.Metadata.UID}, nil
}
