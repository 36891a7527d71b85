import sys
for _n in ('scipy', 'torchvision', 'pandas', 'pyarrow', 'cv2', 'sklearn'):
    sys.modules.setdefault(_n, None)
