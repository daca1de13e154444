package secrets

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"time"
)

// Kinds of a cluster's secrets, as stored (one row each).
const (
	// KindCA is the cluster's CA: certificate and key (PEM), what kubeadm's
	// init makes as /etc/kubernetes/pki/ca.{crt,key}.
	KindCA = "ca"
	// KindAdmin is the admin client certificate and key (PEM) the CA
	// signed: CN kubernetes-admin, O system:masters.
	KindAdmin = "admin"
)

// Lifetimes of what NewCredentials makes, kubeadm's: the CA ten years, the
// admin client certificate one.
const (
	CALifetime    = 10 * 365 * 24 * time.Hour
	AdminLifetime = 365 * 24 * time.Hour
)

// Admin client certificate's subject: kubeadm's admin.conf user, whom
// Kubernetes' default RBAC makes cluster-admin through the group.
const (
	AdminCommonName   = "kubernetes-admin"
	AdminOrganization = "system:masters"
)

// Credentials are a cluster's CA and its admin client certificate, PEM.
type Credentials struct {
	CACert, CAKey       []byte
	AdminCert, AdminKey []byte
}

// NewCredentials makes a cluster's CA (ECDSA P-256, CN kubernetes) and an
// admin client certificate it signs, valid from a minute before now (clock
// skew).
func NewCredentials(now time.Time) (Credentials, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Credentials{}, fmt.Errorf("CA key: %w", err)
	}
	start := now.Add(-time.Minute).UTC()
	caTmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: "kubernetes"},
		NotBefore:             start,
		NotAfter:              start.Add(CALifetime),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		BasicConstraintsValid: true,
		IsCA:                  true,
		SubjectKeyId:          keyID(&caKey.PublicKey),
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return Credentials{}, fmt.Errorf("CA certificate: %w", err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return Credentials{}, fmt.Errorf("CA certificate: %w", err)
	}
	adminKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Credentials{}, fmt.Errorf("admin key: %w", err)
	}
	adminTmpl := &x509.Certificate{
		SerialNumber: serial(),
		Subject:      pkix.Name{CommonName: AdminCommonName, Organization: []string{AdminOrganization}},
		NotBefore:    start,
		NotAfter:     start.Add(AdminLifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	adminDER, err := x509.CreateCertificate(rand.Reader, adminTmpl, ca, &adminKey.PublicKey, caKey)
	if err != nil {
		return Credentials{}, fmt.Errorf("admin certificate: %w", err)
	}
	caKeyDER, err := x509.MarshalECPrivateKey(caKey)
	if err != nil {
		return Credentials{}, err
	}
	adminKeyDER, err := x509.MarshalECPrivateKey(adminKey)
	if err != nil {
		return Credentials{}, err
	}
	return Credentials{
		CACert:    pemBlock("CERTIFICATE", caDER),
		CAKey:     pemBlock("EC PRIVATE KEY", caKeyDER),
		AdminCert: pemBlock("CERTIFICATE", adminDER),
		AdminKey:  pemBlock("EC PRIVATE KEY", adminKeyDER),
	}, nil
}

// Bundle is a certificate and its key as one stored value (PEM, the
// certificate first).
func Bundle(cert, key []byte) []byte {
	return append(append([]byte{}, cert...), key...)
}

// SplitBundle takes a Bundle apart.
func SplitBundle(b []byte) (cert, key []byte, err error) {
	for rest := b; ; {
		var blk *pem.Block
		blk, rest = pem.Decode(rest)
		if blk == nil {
			break
		}
		switch {
		case blk.Type == "CERTIFICATE" && cert == nil:
			cert = pem.EncodeToMemory(blk)
		case key == nil && blk.Type != "CERTIFICATE":
			key = pem.EncodeToMemory(blk)
		}
	}
	if cert == nil || key == nil {
		return nil, nil, errors.New("secrets: bundle lacks a certificate or a key")
	}
	return cert, key, nil
}

func pemBlock(typ string, der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der})
}

// serial is a random 128-bit serial number (RFC 5280 allows up to 20 bytes).
func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail on supported platforms
	}
	return n.Add(n, big.NewInt(1))
}

// keyID is a subject key identifier: the SHA-256 of the public key, cut to
// 20 bytes.
func keyID(pub *ecdsa.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha256.Sum256(der)
	return sum[:20]
}
