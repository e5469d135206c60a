package dlock

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// writeCert writes a certificate (signed by parent, or self-signed) and
// its key as PEM files in dir; returns the paths, the certificate and key.
func writeCert(t *testing.T, dir, name string, tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (string, string, *x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPath, keyPath := filepath.Join(dir, name+".pem"), filepath.Join(dir, name+".key")
	if err := os.WriteFile(certPath, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyPath, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certPath, keyPath, cert, key
}

func TestTLSAndMutualTLSFromTheEnvironment(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	caPath, _, ca, caKey := writeCert(t, dir, "ca", &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}, nil, nil)
	srvCert, srvKey, _, _ := writeCert(t, dir, "server", &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	cliCert, cliKey, _, _ := writeCert(t, dir, "client", &x509.Certificate{
		SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "worker"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	ctx := testCtx(t)

	s := startServer(t, "", "--tls-cert", srvCert, "--tls-key", srvKey)
	t.Setenv("DLOCK_TLS_CA", caPath)
	c := connect(t, s.Addr, nil)
	if _, err := c.Lock(ctx, []string{"k"}, &LockOptions{Try: true}); err != nil {
		t.Fatal(err)
	}
	// Plain TCP to a TLS server fails, with a hint.
	t.Setenv("DLOCK_TLS_CA", "")
	if _, err := Connect(ctx, s.Addr, &Options{ConnectTimeout: 2 * time.Second}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("plain TCP to a TLS server: %v", err)
	}

	mutual := startServer(t, "", "--tls-cert", srvCert, "--tls-key", srvKey, "--tls-client-ca", caPath)
	t.Setenv("DLOCK_TLS_CA", caPath)
	if _, err := Connect(ctx, mutual.Addr, &Options{ConnectTimeout: 2 * time.Second}); err == nil {
		t.Fatal("a server that requires a client certificate accepted none")
	}
	t.Setenv("DLOCK_TLS_CERT", cliCert)
	t.Setenv("DLOCK_TLS_KEY", cliKey)
	m := connect(t, mutual.Addr, nil)
	if _, err := m.Ping(ctx); err != nil {
		t.Fatal(err)
	}
}
