// Command openapi-details adds to the OpenAPI document `make generate` writes
// the definitions of the error details clusterd's errors carry in their
// google.rpc.Status `details`: google.rpc.ErrorInfo (always) and
// google.rpc.BadRequest (invalid arguments), with the types they use.
//
// protoc-gen-openapiv2 renders only the messages a route reaches, and
// `details` is a list of google.protobuf.Any, so without this step a
// generated client has no type for the details it must read. The schemas are
// derived from the published Go types' descriptors (the JSON names protojson
// writes), never written by hand; the rest of the document is rewritten
// byte for byte as the generator wrote it.
//
//	go run ./tools/openapi-details gen/openapiv2/clusterd.swagger.json
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// details are the detail messages clusterd's errors carry, with what each
// holds there (Go descriptors have no comments to take this from).
var details = []struct {
	msg         proto.Message
	description string
}{
	{&errdetails.ErrorInfo{}, "A detail of every clusterd error (`@type` " +
		"`type.googleapis.com/google.rpc.ErrorInfo`): `reason` is stable (e.g. OPERATION_IN_PROGRESS, " +
		"ETAG_MISMATCH, INVALID_ARGUMENT, NOT_FOUND, CREDENTIALS_MISSING), `domain` is clusterd.dev, " +
		"`metadata` names what the error is about (e.g. resource, cluster, operation, step)."},
	{&errdetails.BadRequest{}, "A detail of INVALID_ARGUMENT errors (`@type` " +
		"`type.googleapis.com/google.rpc.BadRequest`): one violation per invalid field, so that a " +
		"client can fix all fields at once."},
	{&errdetails.BadRequest_FieldViolation{}, "One invalid field: `field` is its path in the " +
		"request (e.g. cluster.display_name), `description` says what is wrong with it."},
	{&errdetails.LocalizedMessage{}, "A message in a given locale (clusterd sends none)."},
}

func main() {
	if len(os.Args) != 2 {
		fmt.Fprintln(os.Stderr, "usage: openapi-details FILE")
		os.Exit(2)
	}
	if err := run(os.Args[1]); err != nil {
		fmt.Fprintln(os.Stderr, "openapi-details:", err)
		os.Exit(1)
	}
}

func run(path string) error {
	raw, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	doc, err := decodeObject(raw)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	var defs map[string]json.RawMessage
	if err := json.Unmarshal(doc.get("definitions"), &defs); err != nil || defs == nil {
		return fmt.Errorf("%s: no definitions: %v", path, err)
	}
	for _, d := range details {
		md := d.msg.ProtoReflect().Descriptor()
		s, err := schema(md, d.description)
		if err != nil {
			return err
		}
		if defs[definitionName(md)], err = json.Marshal(s); err != nil {
			return err
		}
	}
	if err := doc.set("definitions", defs); err != nil {
		return err
	}
	var out bytes.Buffer
	enc := json.NewEncoder(&out) // as protoc-gen-openapiv2 writes it
	enc.SetIndent("", "  ")
	if err := enc.Encode(doc); err != nil {
		return err
	}
	return os.WriteFile(path, out.Bytes(), 0o644)
}

// definitionName is the name protoc-gen-openapiv2 (legacy naming) gives a
// message: the last package component and the name (rpcErrorInfo), or the
// parent message's name and the name for a nested one
// (BadRequestFieldViolation).
func definitionName(md protoreflect.MessageDescriptor) string {
	if parent, ok := md.Parent().(protoreflect.MessageDescriptor); ok {
		return string(parent.Name()) + string(md.Name())
	}
	pkg := string(md.ParentFile().Package())
	return pkg[strings.LastIndex(pkg, ".")+1:] + string(md.Name())
}

// schemaObject is the subset of an OpenAPI 2.0 schema these messages need.
type schemaObject struct {
	Type                 string         `json:"type,omitempty"`
	Ref                  string         `json:"$ref,omitempty"`
	Items                *schemaObject  `json:"items,omitempty"`
	Properties           *orderedObject `json:"properties,omitempty"`
	AdditionalProperties *schemaObject  `json:"additionalProperties,omitempty"`
	Description          string         `json:"description,omitempty"`
}

// schema is the definition of a message: its fields under their JSON names,
// in field order.
func schema(md protoreflect.MessageDescriptor, description string) (*schemaObject, error) {
	props := &orderedObject{}
	fields := md.Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		fs, err := fieldSchema(fd)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", fd.FullName(), err)
		}
		if err := props.set(fd.JSONName(), fs); err != nil {
			return nil, err
		}
	}
	return &schemaObject{Type: "object", Properties: props, Description: description}, nil
}

func fieldSchema(fd protoreflect.FieldDescriptor) (*schemaObject, error) {
	if fd.IsMap() {
		v, err := singular(fd.MapValue())
		if err != nil {
			return nil, err
		}
		return &schemaObject{Type: "object", AdditionalProperties: v}, nil
	}
	s, err := singular(fd)
	if err != nil {
		return nil, err
	}
	if fd.IsList() {
		if s.Ref != "" {
			s.Type = "object" // as protoc-gen-openapiv2 writes a list of messages
		}
		return &schemaObject{Type: "array", Items: s}, nil
	}
	return s, nil
}

func singular(fd protoreflect.FieldDescriptor) (*schemaObject, error) {
	switch fd.Kind() {
	case protoreflect.StringKind:
		return &schemaObject{Type: "string"}, nil
	case protoreflect.MessageKind:
		return &schemaObject{Ref: "#/definitions/" + definitionName(fd.Message())}, nil
	}
	return nil, fmt.Errorf("field kind %s is not supported", fd.Kind())
}

// orderedObject is a JSON object that keeps its keys in order, so that the
// document is written back as the generator wrote it.
type orderedObject struct {
	keys []string
	vals map[string]json.RawMessage
}

func decodeObject(raw []byte) (*orderedObject, error) {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return nil, fmt.Errorf("not a JSON object: %v", err)
	}
	o := &orderedObject{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return nil, err
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
		if err := o.set(t.(string), v); err != nil {
			return nil, err
		}
	}
	if _, err := dec.Token(); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, errors.New("data after the JSON object")
	}
	return o, nil
}

func (o *orderedObject) get(key string) json.RawMessage { return o.vals[key] }

func (o *orderedObject) set(key string, v any) error {
	raw, ok := v.(json.RawMessage)
	if !ok {
		var err error
		if raw, err = json.Marshal(v); err != nil {
			return err
		}
	}
	if o.vals == nil {
		o.vals = map[string]json.RawMessage{}
	}
	if _, seen := o.vals[key]; !seen {
		o.keys = append(o.keys, key)
	}
	o.vals[key] = raw
	return nil
}

// MarshalJSON writes the keys in order.
func (o *orderedObject) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			b.WriteByte(',')
		}
		name, err := json.Marshal(k)
		if err != nil {
			return nil, err
		}
		b.Write(name)
		b.WriteByte(':')
		b.Write(o.vals[k])
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}
