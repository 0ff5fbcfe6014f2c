// Command monitoringcheck validates Prometheus Operator objects (ServiceMonitor, PodMonitor,
// PrometheusRule) read as YAML documents on stdin against the operator's own Go API types,
// strictly: an unknown or misspelt field, or a value of the wrong type, is an error. The
// deploy tests use it beside the operator's CRD schemas, as a second and independent check.
// Prints one line per problem and exits 1 if there was any.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

func main() {
	reader := utilyaml.NewYAMLReader(bufio.NewReader(os.Stdin))
	problems, checked := 0, 0
	for {
		doc, err := reader.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			fmt.Printf("read: %v\n", err)
			os.Exit(2)
		}
		raw, err := yaml.YAMLToJSON(doc)
		if err != nil || string(bytes.TrimSpace(raw)) == "null" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if json.Unmarshal(raw, &head) != nil || head.APIVersion != "monitoring.coreos.com/v1" {
			continue
		}
		var target any
		switch head.Kind {
		case "ServiceMonitor":
			target = &monitoringv1.ServiceMonitor{}
		case "PodMonitor":
			target = &monitoringv1.PodMonitor{}
		case "PrometheusRule":
			target = &monitoringv1.PrometheusRule{}
		default:
			fmt.Printf("%s: kind not checked\n", head.Kind)
			problems++
			continue
		}
		decoder := json.NewDecoder(bytes.NewReader(raw))
		decoder.DisallowUnknownFields()
		if err := decoder.Decode(target); err != nil {
			fmt.Printf("%s: %v\n", head.Kind, err)
			problems++
			continue
		}
		checked++
	}
	fmt.Printf("checked %d objects, %d problems\n", checked, problems)
	if problems > 0 {
		os.Exit(1)
	}
}
